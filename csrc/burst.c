/* burst.c: co-running jobs on one GPU take turns burst by burst, through a page they share.
 *
 * While the daemon lets several jobs co-run on a GPU (shared grants), each job's bursts (from the
 * first launch after an idle moment to the synchronise that finds its work done) would overlap the
 * others' and the hardware would time-slice them: both bursts take longer, and equal jobs whose
 * steps start together stay together. Asking the daemon for every burst costs a round trip (about
 * 0.3 ms in Python, measured on the H100), which is 6 % of a 5 ms burst. So co-runners coordinate
 * among themselves, through one page per GPU that the daemon hands each of them (a sealed memfd:
 * nobody can shrink it under the others): a burst begins by taking the page's owner word, and ends
 * by clearing it and waking who waits (a futex on the page, microseconds).
 *
 * The page is shared between tenants, so nothing in it is trusted: a job waits for another's burst
 * at most about its own mean burst (BURST_WAIT_FACTOR, at least BURST_WAIT_MIN_NS, at most
 * BURST_WAIT_MAX_NS), then runs beside it as plain co-location would. A job that died or that
 * writes nonsense into the page can so cost another job at most its own burst length per step,
 * what co-running with it would cost anyway. Hot path: a relaxed load of burst_armed in the gate
 * (and of in_burst when armed).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "burst.h"
#include "env.h"
#include "gpus.h"

#define BURST_WAIT_FACTOR 1.5
#define BURST_WAIT_MIN_NS 500000ull        /* 0.5 ms */
#define BURST_WAIT_MAX_NS 50000000ull      /* 50 ms */
#define BURST_WAIT_UNKNOWN_NS 2000000ull   /* own bursts not measured yet: 2 ms */
/* Waited in vain this many times in a row (the owner's bursts are much longer than ours, or it
 * never gives the page back): co-run without looking at the page for BURST_IGNORE_NS. */
#define BURST_TIMEOUTS_IN_ROW 3
#define BURST_IGNORE_NS 1000000000ull

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *timeout)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, timeout, NULL, 0);
}

/* Not the pid: jobs in other pid namespaces may share the page. */
static _Atomic uint32_t token;
static uint32_t my_token(void)
{
    uint32_t t = atomic_load_explicit(&token, memory_order_relaxed);
    if (!t) {
        uint64_t x = nvshare_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&t;
        x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33;
        t = (uint32_t)x ? (uint32_t)x : 1u;
        uint32_t none = 0;
        if (!atomic_compare_exchange_strong(&token, &none, t))
            t = none;
    }
    return t;
}

void nvshare_burst_after_fork(void)
{
    atomic_store(&token, 0);
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n && i < NVSHARE_MAX_GPUS; i++) {
        atomic_store(&nvshare_gpus[i].burst.in_burst, 0);
        atomic_store(&nvshare_gpus[i].burst.owner, 0);
        atomic_store(&nvshare_gpus[i].burst.waiting, 0);
        atomic_store(&nvshare_gpus[i].burst.armed, 0);
        atomic_store(&nvshare_gpus[i].burst.mean_ns, 0);
        nvshare_gpus[i].burst.timeouts_row = 0;
        nvshare_gpus[i].burst.ignore_until = 0;
    }
}

/* The page the daemon passed (BURST_PAGE). Only a memfd sealed against shrinking is mapped: a
 * page that another job could truncate would kill this one (SIGBUS) at its next burst. */
int nvshare_burst_attach(struct nvshare_gpu *g, int fd)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) != 0 ||
        st.st_size < (off_t)sizeof(struct nvshare_burst_page)) {
        close(fd);
        return -1;
    }
    void *page = mmap(NULL, sizeof(struct nvshare_burst_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (page == MAP_FAILED)
        return -1;
    /* A restarted daemon's page replaces the old one, which stays mapped (4 KiB per restart): a
     * thread may still be waiting on it. */
    atomic_store(&g->burst.page, (struct nvshare_burst_page *)page);
    nvshare_debug("gpu %s: burst page received", g->uuid);
    return 0;
}

void nvshare_burst_arm(struct nvshare_gpu *g, int on)
{
    atomic_store(&g->burst.armed, on && atomic_load(&g->burst.page) != NULL);
}

void nvshare_burst_note_mean(struct nvshare_gpu *g, uint64_t mean_ns)
{
    atomic_store_explicit(&g->burst.mean_ns, mean_ns, memory_order_relaxed);
}

static uint64_t wait_bound(struct nvshare_gpu *g)
{
    uint64_t mean = atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed);
    if (!mean)
        return BURST_WAIT_UNKNOWN_NS;
    uint64_t b = (uint64_t)(mean * BURST_WAIT_FACTOR);
    return b < BURST_WAIT_MIN_NS ? BURST_WAIT_MIN_NS : b > BURST_WAIT_MAX_NS ? BURST_WAIT_MAX_NS : b;
}

void nvshare_burst_begin(struct nvshare_gpu *g)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g->burst.in_burst, &expected, 1))
        return;  /* another thread of this process began it */
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    uint64_t now = nvshare_now_ns();
    if (!p || now < g->burst.ignore_until)
        return;
    uint32_t me = my_token();
    uint64_t deadline = now + wait_bound(g);
    atomic_fetch_add(&g->burst.waiting, 1);
    for (;;) {
        uint32_t seq = atomic_load(&p->seq);
        uint32_t cur = 0;
        if (atomic_compare_exchange_strong(&p->owner, &cur, me) || cur == me) {
            atomic_store(&g->burst.owner, 1);
            g->burst.timeouts_row = 0;
            break;
        }
        now = nvshare_now_ns();
        if (now >= deadline) {
            /* Run beside it, as co-location would, and take the page over: an owner that died
             * holding it would otherwise cost every later burst of the others a whole wait. */
            if (atomic_compare_exchange_strong(&p->owner, &cur, me))
                atomic_store(&g->burst.owner, 1);
            if (++g->burst.timeouts_row >= BURST_TIMEOUTS_IN_ROW) {
                g->burst.timeouts_row = 0;
                g->burst.ignore_until = now + BURST_IGNORE_NS;
                nvshare_debug("gpu %s: waited in vain for %d co-runner bursts in a row; co-running "
                              "for %.0f s", g->uuid, BURST_TIMEOUTS_IN_ROW, BURST_IGNORE_NS / 1e9);
            }
            break;
        }
        uint64_t left = deadline - now;
        struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
        atomic_fetch_add(&p->waiters, 1);
        futex(&p->seq, FUTEX_WAIT, seq, &ts);
        atomic_fetch_sub(&p->waiters, 1);
    }
    atomic_fetch_sub(&g->burst.waiting, 1);
}

void nvshare_burst_end(struct nvshare_gpu *g)
{
    if (!atomic_exchange(&g->burst.in_burst, 0))
        return;
    if (!atomic_exchange(&g->burst.owner, 0))
        return;
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    if (!p)
        return;
    uint32_t me = my_token();
    atomic_compare_exchange_strong(&p->owner, &me, 0);
    atomic_fetch_add(&p->seq, 1);
    if (atomic_load(&p->waiters))
        futex(&p->seq, FUTEX_WAKE, 1, NULL);
}
