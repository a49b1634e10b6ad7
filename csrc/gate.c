/* gate.c: per-GPU lock state, the gate every GPU-bound call passes, and hand-over.
 *
 * Events from the daemon arrive as nvshare_gate_on_*() calls (events.c, on client.c's reader thread);
 * what the gate tells the daemon goes into the outbox (outbox.c), never straight to the socket. Each gated GPU has a keeper thread that gives the lock back: at once on DROP_LOCK, and on
 * LOCK_CONTENDED as soon as nothing entered the gate, and no thread waited in a synchronising call,
 * for the adaptive idle threshold. Giving back =
 * close the gate, wait for the threads inside to leave and for open graph captures to end,
 * synchronise this GPU's contexts (with a deadline: DRAIN_STUCK), move the
 * bytes the daemon asked for to host memory (swap.c), send LOCK_RELEASED. The keeper also brings
 * swapped memory back after a grant before it opens the gate, and swaps out on PREPARE_SWAP_OUT
 * while the process does not hold the GPU. Lock order: swap_mu before mu.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "burst.h"
#include "client.h"
#include "driver.h"
#include "env.h"
#include "gate.h"
#include "gpus.h"
#include "memory.h"
#include "outbox.h"
#include "swap.h"

#define IDLE_MIN_NS 100000ull        /* 100 us */
/* Measured on the H100: with a 100 ms cap a job whose start-up made many quick re-requests kept a
 * 100 ms threshold for good and never gave the GPU up in its 91 ms pauses. A hand-over without swap
 * costs well under a millisecond, so erring towards giving back early is cheap. */
#define IDLE_MAX_NS 20000000ull      /* 20 ms */

/* ---- hand-over between exclusive turns ------------------------------------------------------ */
/* When an exclusive turn ends and the switch moves no memory, the daemon gives the holder and its
 * successor one eventfd (HANDOFF) before the holder's DROP_LOCK. The holder's drainer writes it the
 * moment its work is done; the successor, waiting for the lock, starts on it rather than after the
 * daemon's round trip (LOCK_RELEASED, then LOCK_GRANT, which still comes and then changes nothing).
 * Only those two processes and the daemon have the eventfd. A holder that wrote it early would have
 * its successor run beside its drain: no worse than that holder bypassing the hook. */
#define HANDOFF_POLL_MS 50    /* a waiting thread looks at the lock's state again after this */

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static void signal_fd(int fd)
{
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

/* With g->gate.mu held: the GPU is free for the successor (the holder's work drained). Logged
 * first: a process that ends while its drainer signals may be gone before a line written after,
 * and its successor's "passed on" then had no "drained" to match (1 of 30 runs of
 * tests/hook/test_hook_handoff.py on a loaded machine). */
static void handoff_signal(struct nvshare_gpu *g)
{
    if (g->gate.handoff_out_fd < 0)
        return;
    nvshare_debug("gpu %s: drained; the next holder may start (hand-over)", g->uuid);
    signal_fd(g->gate.handoff_out_fd);
    close_fd(&g->gate.handoff_out_fd);
}

/* With g->gate.mu held: forget the hand-over we wait for; a thread polling a copy of it wakes up. */
static void handoff_forget(struct nvshare_gpu *g)
{
    if (g->gate.handoff_in_fd < 0)
        return;
    if (g->gate.handoff_polling)
        signal_fd(g->gate.handoff_in_fd);
    close_fd(&g->gate.handoff_in_fd);
}

static void open_gate(struct nvshare_gpu *g, uint64_t swapped);
static void ensure_keeper(struct nvshare_gpu *g);

/* With g->gate.mu held: what of g's memory is in host memory (memory.c's count), for open_gate. */
static uint64_t swapped_bytes(struct nvshare_gpu *g)
{
    struct nvshare_mem_numbers numbers;
    nvshare_mem_numbers(g, &numbers);
    return numbers.swapped;
}

/* With g->gate.mu held: this process holds the lock from now on, by grant or by hand-over. The
 * gate's part only: the caller then arms bursts (burst.c) and opens the gate. */
static void hold_lock(struct nvshare_gpu *g)
{
    ensure_keeper(g);
    atomic_store(&g->mode, GPU_GATED);
    g->gate.held = 1;
    g->gate.contended = 0;
    g->gate.drop_pending = 0;
    g->gate.granted_ns = nvshare_now_ns();
    g->gate.no_room_until = 0;
}

/* With g->gate.mu held, waiting for the lock: the holder says the GPU is ours. Memory of ours in host
 * memory must come back first, which the grant arranges: then we wait for it. */
static void handoff_take(struct nvshare_gpu *g)
{
    if (g->gate.held || !g->gate.requested || atomic_load(&g->mode) == GPU_PASS || g->gate.swap_busy ||
        !nvshare_outbox_connected() || swapped_bytes(g))
        return;
    /* g->gate.requested stays: the grant that follows answers the request, and says whether to wait
     * out prompt bursts. Until it comes, as the last grant said: disarmed, the turn's first step
     * went out whole before the grant (10 kernels at once on the fake driver, and a served request
     * on the H200 shared the GPU with it: its slowest came just after hand-overs). */
    hold_lock(g);
    nvshare_burst_arm(g, 0, g->gate.last_yields);
    open_gate(g, 0);   /* nothing swapped, looked at under this mutex just now */
    nvshare_debug("gpu %s: lock passed on by hand-over (the grant follows)", g->uuid);
}

/* With g->gate.mu held; returns with it held. Polls a copy of handoff_in_fd, so that the reader thread
 * may forget it meanwhile (and write it to wake us). */
static void wait_for_handoff(struct nvshare_gpu *g)
{
    unsigned gen = g->gate.handoff_gen;
    int fd = fcntl(g->gate.handoff_in_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        close_fd(&g->gate.handoff_in_fd);
        return;
    }
    g->gate.handoff_polling = 1;
    pthread_mutex_unlock(&g->gate.mu);
    struct pollfd p = {fd, POLLIN, 0};
    uint64_t value;
    int fired = poll(&p, 1, HANDOFF_POLL_MS) > 0 && read(fd, &value, sizeof value) == (ssize_t)sizeof value;
    close(fd);
    pthread_mutex_lock(&g->gate.mu);
    g->gate.handoff_polling = 0;
    if (fired && gen == g->gate.handoff_gen && g->gate.handoff_in_fd >= 0) {
        close_fd(&g->gate.handoff_in_fd);
        handoff_take(g);
    }
}

/* ---- waiting for the lock ------------------------------------------------------------------- */
#define QUICK_REASKS 2   /* idle releases in a row that were no pause: the demand figures are stale */
static void adapt_threshold(struct nvshare_gpu *g, uint64_t now)
{
    if (!g->gate.last_release_idle)
        return;
    g->gate.last_release_idle = 0;
    uint64_t gap = now - g->gate.last_release_ns;
    /* Was that a pause? A job with real pauses asks again about its mean pause later; one that
     * asks within a quarter of it was only between two launches (QUICK_REASKS). */
    uint64_t pause = atomic_load_explicit(&g->gate.gap_mean_ns, memory_order_relaxed);
    if (pause && gap < pause / 4)
        g->gate.quick_reasks = g->gate.quick_reasks < QUICK_REASKS ? g->gate.quick_reasks + 1 : QUICK_REASKS;
    else
        g->gate.quick_reasks = 0;
    /* Asked again right after an early release: it was not idle, only between bursts. */
    if (gap < 2 * g->gate.idle_threshold_ns + 1000000ull)
        g->gate.idle_threshold_ns = g->gate.idle_threshold_ns * 2 > IDLE_MAX_NS ? IDLE_MAX_NS : g->gate.idle_threshold_ns * 2;
    else
        g->gate.idle_threshold_ns = g->gate.idle_threshold_ns * 3 / 4 < IDLE_MIN_NS ? IDLE_MIN_NS
                                                                          : g->gate.idle_threshold_ns * 3 / 4;
}

/* The idle threshold when others wait. A job with real pauses (busy below BURSTY_PPM, its mean
 * pause known) gives the GPU back within an eighth of its mean pause, at most BURSTY_MAX_NS,
 * whatever the adaptive threshold has grown to (it doubles when a job asks again soon after an
 * early release, as a bursty job does after every pause): the partner's burst then runs in the
 * pause instead of beside the next burst. Seen on the H100 without it (issue 12, 5 ms bursts,
 * 3-12 ms pauses, auto_share turns): the threshold reached its 20 ms cap, holders kept whole
 * 100 ms turns every other time, and such pairs ran at 0.75-1.2x serial. A busier job keeps the
 * adaptive threshold: handing over in every short gap of a compute-bound step costs a hand-over
 * per step.
 * The figures can be stale: lock waits are left out of them (demand.c), so a job that holds the
 * GPU only briefly adds a sample or two per rotation, and a training whose start-up read 35 % busy
 * (4 ms gaps) still read so seconds later. Released in each half-millisecond host hiccup, it asked
 * again at once, waited for the others' turns, and its figures never caught up: on the fake driver
 * three equal trainings (1 s switch interval) held the GPU 0.7 s, 2.9 s and 0.3 s of 4 s, and on
 * the H100 10.7 s, 3.2 s and 2.4 s of 15.4 s (the short-turn jobs' median turn 5-6 ms). So after
 * QUICK_REASKS idle releases in a row each asked again within a quarter of the mean pause (no
 * pause at all), the job keeps the adaptive threshold until it asks again after a real pause. */
#define BURSTY_PPM 800000u
#define BURSTY_MAX_NS 1000000ull   /* an eighth of 45 ms pauses, 5.6 ms, was waited at each hand-over */
static uint64_t contended_threshold(struct nvshare_gpu *g)
{
    uint64_t gap = atomic_load_explicit(&g->gate.gap_mean_ns, memory_order_relaxed);
    if (!gap || atomic_load_explicit(&g->gate.busy_ppm, memory_order_relaxed) >= BURSTY_PPM ||
        g->gate.quick_reasks >= QUICK_REASKS)
        return g->gate.idle_threshold_ns;
    uint64_t t = gap / 8 < IDLE_MIN_NS ? IDLE_MIN_NS : gap / 8 > BURSTY_MAX_NS ? BURSTY_MAX_NS : gap / 8;
    return t < g->gate.idle_threshold_ns ? t : g->gate.idle_threshold_ns;
}

/* Did a synchronising call end after `t`? Its kernels ran until then: the GPU was not idle. */
static int synced_since(struct nvshare_gpu *g, uint64_t t)
{
    return atomic_load_explicit(&g->gate.sync_ended_ns, memory_order_relaxed) > t;
}

/* Has nothing entered the gate, run inside it or waited for this GPU's work for `threshold`? */
static int idle_for(struct nvshare_gpu *g, uint64_t threshold)
{
    uint64_t since = atomic_load_explicit(&g->gate.idle_since_ns, memory_order_relaxed);
    uint64_t now = nvshare_now_ns();
    return since && since >= g->gate.granted_ns && now - since >= threshold &&
           !atomic_load(&g->gate.demand_touched) && atomic_load(&g->gate.inside) == 0 &&
           atomic_load(&g->gate.captures) == 0 && atomic_load(&g->gate.syncing) == 0 &&
           !synced_since(g, now - threshold);
}

/* Called with the gate found shut: ask for the lock if nobody has, then wait for the grant. */
void nvshare_gate_wait(struct nvshare_gpu *g)
{
    nvshare_client_start();
    pthread_mutex_lock(&g->gate.mu);
    g->gate.waiters++;
    while (!(atomic_load(&g->gate.open) && !atomic_load(&g->gate.closing))) {
        uint64_t now = nvshare_now_ns();
        if (!g->gate.held && !g->gate.requested && g->gate.no_room_until > now) {
            /* Our memory did not fit back last time: give the others time before asking again. */
            struct timespec until = {(time_t)(g->gate.no_room_until / 1000000000ull),
                                     (long)(g->gate.no_room_until % 1000000000ull)};
            pthread_cond_timedwait(&g->gate.waiters_cv, &g->gate.mu, &until);
            continue;
        }
        if (!g->gate.held && !g->gate.requested && !atomic_load(&g->gate.closing) && nvshare_outbox_connected()) {
            adapt_threshold(g, now);
            uint32_t seq;
            if (nvshare_outbox_gpu_event(NVSHARE_MSG_LOCK_REQUEST, g->uuid, 0, 0, &seq) == 0) {
                g->gate.requested = 1;
                g->gate.request_seq = seq;
                nvshare_debug("gpu %s: lock requested", g->uuid);
            }
        }
        if (g->gate.handoff_in_fd >= 0 && !g->gate.handoff_polling && !g->gate.held) {
            wait_for_handoff(g);
            continue;
        }
        pthread_cond_wait(&g->gate.waiters_cv, &g->gate.mu);
    }
    g->gate.waiters--;
    pthread_mutex_unlock(&g->gate.mu);
}

/* ---- graph capture ------------------------------------------------------------------------- */
/* A capture only records work, so a thread that has one open passes the gate (it must be able to
 * reach cuStreamEndCapture). Synchronising a context while a capture is open breaks the capture
 * (the driver answers 900 and invalidates it, in every capture mode), so a drain waits until no
 * capture is open on that GPU. A capture begins inside the gate, so none can begin during a drain. */
NVSHARE_TLS atomic_int nvshare_tl_capturing;

#define MAX_CAPTURES 256
struct capture {
    CUstream stream;
    struct nvshare_gpu *gpu;
    atomic_int *owner;   /* the beginning thread's nvshare_tl_capturing */
};
static struct capture captures[MAX_CAPTURES];
static int n_captures;
static pthread_mutex_t capture_mu = PTHREAD_MUTEX_INITIALIZER;

static int per_thread_handle(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }

void nvshare_capture_began(struct nvshare_gpu *g, CUstream stream)
{
    if (!g)
        return;
    pthread_mutex_lock(&capture_mu);
    if (n_captures < MAX_CAPTURES) {
        captures[n_captures++] = (struct capture){stream, g, &nvshare_tl_capturing};
        atomic_fetch_add(&g->gate.captures, 1);
        atomic_fetch_add(&nvshare_tl_capturing, 1);
    } else {
        nvshare_log("gpu %s: more than %d graph captures open; a hand-over now may break one", g->uuid,
                    MAX_CAPTURES);
    }
    pthread_mutex_unlock(&capture_mu);
}

void nvshare_capture_ended(CUstream stream)
{
    pthread_mutex_lock(&capture_mu);
    for (int i = 0; i < n_captures; i++) {
        struct capture *c = &captures[i];
        if (c->stream != stream || (per_thread_handle(stream) && c->owner != &nvshare_tl_capturing))
            continue;
        atomic_fetch_sub(&c->gpu->gate.captures, 1);
        atomic_fetch_sub(c->owner, 1);
        pthread_cond_broadcast(&c->gpu->gate.keeper_cv);
        *c = captures[--n_captures];
        break;
    }
    pthread_mutex_unlock(&capture_mu);
}

/* ---- giving the lock back ------------------------------------------------------------------- */
#define DRAIN_POLL_NS 20000ull             /* threads still inside the gate: look again after this */
#define CAPTURE_POLL_NS 1000000ull         /* a capture still open: look again after this */
#define DRAIN_RETRY_NS 100000000ull        /* a synchronise failed: try again after this */
#define NO_ROOM_RETRY_NS 250000000ull      /* swap-in found no room: ask for the GPU again after this */
#define THREAD_STACK_BYTES (256 * 1024)

enum { DRAIN_IDLE = 0, DRAIN_REQUESTED, DRAIN_RUNNING, DRAIN_DONE };

static int capture_error(CUresult rc) { return rc >= 900 && rc <= 909; }

/* Waits for the threads inside the gate and for open captures, then synchronises. */
static CUresult drain_now(struct nvshare_gpu *g)
{
    struct timespec pause = {0, (long)DRAIN_POLL_NS};
    while (atomic_load(&g->gate.inside) > 0)
        nanosleep(&pause, NULL);
    struct timespec capture_pause = {0, (long)CAPTURE_POLL_NS};
    while (atomic_load(&g->gate.captures) > 0)
        nanosleep(&capture_pause, NULL);
    return nvshare_gpus_sync_contexts(g);
}

/* The drainer runs drain_now() for the keeper, so that the keeper can keep the drain's deadline. */
static void *drainer_main(void *arg)
{
    struct nvshare_gpu *g = arg;
    nvshare_in_hook = 1;
    pthread_mutex_lock(&g->gate.mu);
    for (;;) {
        while (g->gate.drain_state != DRAIN_REQUESTED)
            pthread_cond_wait(&g->gate.drain_cv, &g->gate.mu);
        g->gate.drain_state = DRAIN_RUNNING;
        pthread_mutex_unlock(&g->gate.mu);
        CUresult rc = drain_now(g);
        pthread_mutex_lock(&g->gate.mu);
        if (rc == CUDA_SUCCESS && g->gate.handoff_on_drain)
            handoff_signal(g);   /* here, not in the keeper: one thread wake-up less at the switch */
        g->gate.drain_rc = rc;
        g->gate.drain_state = DRAIN_DONE;
        pthread_cond_broadcast(&g->gate.keeper_cv);
    }
    return NULL;
}

static void deadline_after(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += (uint64_t)ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000ull);
    ts->tv_nsec = (long)(ns % 1000000000ull);
}

/* With g->gate.mu held and the gate closing: drains g, waiting as long as it takes. Past the drain deadline
 * a holder tells the daemon (DRAIN_STUCK) and keeps the lock meanwhile: LOCK_RELEASED is never sent
 * while this process's work may still run. A failed synchronise counts as not drained and is tried
 * again; only an error that is not about a capture and persists past the deadline (the context is
 * broken: nothing of it can run any more) counts as drained. Returns with mu held; 0 when drained. */
static int drain_with_deadline(struct nvshare_gpu *g)
{
    uint64_t started = nvshare_now_ns();
    uint64_t limit = (uint64_t)nvshare_cfg.drain_timeout_ms * 1000000ull;
    int stuck = 0, logged_error = 0;
    if (!g->gate.drainer_running) {
        if (nvshare_start_thread(drainer_main, g, THREAD_STACK_BYTES) == 0) {
            g->gate.drainer_running = 1;
        } else {
            pthread_mutex_unlock(&g->gate.mu);  /* no thread: drain here, without a deadline */
            CUresult rc = drain_now(g);
            pthread_mutex_lock(&g->gate.mu);
            return rc == CUDA_SUCCESS ? 0 : -1;
        }
    }
    for (;;) {
        g->gate.drain_state = DRAIN_REQUESTED;
        pthread_cond_signal(&g->gate.drain_cv);
        while (g->gate.drain_state != DRAIN_DONE) {
            uint64_t waited = nvshare_now_ns() - started;
            if (stuck || waited >= limit) {
                if (!stuck && g->gate.held) {
                    nvshare_outbox_gpu_event(NVSHARE_MSG_DRAIN_STUCK, g->uuid, 0, waited / 1000000ull, NULL);
                    nvshare_log("gpu %s: its work did not finish within %u ms of being asked to release; the "
                                "lock is kept until it does (told nvshare-scheduler)", g->uuid,
                                nvshare_cfg.drain_timeout_ms);
                }
                stuck = 1;
                pthread_cond_wait(&g->gate.keeper_cv, &g->gate.mu);
            } else {
                struct timespec deadline;
                deadline_after(&deadline, limit - waited);
                pthread_cond_timedwait(&g->gate.keeper_cv, &g->gate.mu, &deadline);
            }
        }
        g->gate.drain_state = DRAIN_IDLE;
        CUresult rc = g->gate.drain_rc;
        uint64_t waited = nvshare_now_ns() - started;
        if (rc == CUDA_SUCCESS || (!capture_error(rc) && waited >= limit) || !g->gate.held) {
            if (stuck)
                nvshare_log("gpu %s: drained after %.1f s%s", g->uuid, waited / 1e9,
                            rc == CUDA_SUCCESS ? "" : " (its context reports an error: nothing of it runs)");
            return rc == CUDA_SUCCESS || !capture_error(rc) ? 0 : -1;
        }
        if (!logged_error) {
            nvshare_log("gpu %s: synchronising it for a hand-over failed (CUDA error %d); not drained, the "
                        "lock is kept and it is tried again", g->uuid, rc);
            logged_error = 1;
        }
        struct timespec retry;
        deadline_after(&retry, DRAIN_RETRY_NS);
        pthread_cond_timedwait(&g->gate.keeper_cv, &g->gate.mu, &retry);
    }
}

/* With g->gate.mu held, the gate closing and g drained: moves `bytes` out; returns with mu held. */
static uint64_t swap_out_unlocked(struct nvshare_gpu *g, uint64_t bytes)
{
    if (!bytes)
        return 0;
    g->gate.swap_busy = 1;
    pthread_mutex_unlock(&g->gate.mu);
    nvshare_swap_lock(g);
    /* Reported as it goes: the daemon lets the next holder bring its memory back into the room
     * made so far (PREFETCH), so the copies out and in overlap. */
    uint64_t moved = nvshare_swap_out(g, bytes, nvshare_memory_report_moving);
    nvshare_swap_unlock(g);
    nvshare_memory_report(g);
    pthread_mutex_lock(&g->gate.mu);
    g->gate.swap_busy = 0;
    return moved;
}

/* With g->gate.mu held; returns with it held. */
static void release_lock(struct nvshare_gpu *g, uint32_t how)
{
    atomic_store(&g->gate.closing, 1);
    uint64_t want = g->gate.swap_out_bytes;
    g->gate.swap_out_bytes = 0;
    g->gate.handoff_on_drain = want == 0;
    int drained = drain_with_deadline(g) == 0;
    g->gate.handoff_on_drain = 0;
    want = g->gate.swap_cancel ? 0 : want;   /* RESUMED during the drain */
    g->gate.swap_cancel = 0;
    nvshare_swap_set_abort(g, 0);  /* still holding: no grant can overtake this one */
    uint64_t moved = drained ? swap_out_unlocked(g, want) : 0;
    if (g->gate.held && drained) {
        handoff_signal(g);   /* after moving memory out, if it had to */
        g->gate.held = 0;
        atomic_store(&g->gate.open, 0);
        nvshare_burst_arm(g, 0, 0);
        nvshare_burst_end(g);
        g->gate.last_release_ns = nvshare_now_ns();
        g->gate.last_release_idle = how == NVSHARE_RELEASE_IDLE;
        nvshare_outbox_gpu_event(NVSHARE_MSG_LOCK_RELEASED, g->uuid,
                               how | (moved ? NVSHARE_RELEASE_SWAPPED : 0), moved, NULL);
        nvshare_debug("gpu %s: lock released (%s, held %.1f ms, idle threshold %.2f ms, when others wait "
                      "%.2f ms, %.1f MiB swapped out)",
                      g->uuid, how == NVSHARE_RELEASE_IDLE ? "idle" : "dropped",
                      (g->gate.last_release_ns - g->gate.granted_ns) / 1e6, g->gate.idle_threshold_ns / 1e6,
                      contended_threshold(g) / 1e6,
                      moved / 1048576.0);
    }
    g->gate.contended = 0;
    g->gate.drop_pending = 0;
    atomic_store(&g->gate.closing, 0);
    pthread_cond_broadcast(&g->gate.waiters_cv);
}

/* With g->gate.mu held: may work pass the gate now (holding the lock, or ungated)? */
static int should_open(struct nvshare_gpu *g)
{
    return g->gate.held || atomic_load(&g->mode) == GPU_PASS ||
           (nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN && nvshare_outbox_daemon_gone());
}

static void ensure_keeper(struct nvshare_gpu *g);

/* With g->gate.mu held: work may pass. Counted, so that swap.c knows which chunks a prefetch
 * brought back (without contents: born swapped) no work has touched since. */
static void set_open(struct nvshare_gpu *g)
{
    atomic_fetch_add(&g->gate.opens, 1);
    atomic_store(&g->gate.open, 1);
}

/* With g->gate.mu held: open the gate, unless memory must come back first (then the keeper opens it).
 * swapped: what of g's memory is in host memory, looked at under this mutex (swapped_bytes). */
static void open_gate(struct nvshare_gpu *g, uint64_t swapped)
{
    if (swapped || g->gate.swap_busy) {
        g->gate.swap_in_pending = 1;
        ensure_keeper(g);
        pthread_cond_signal(&g->gate.keeper_cv);
        return;
    }
    set_open(g);
    pthread_cond_broadcast(&g->gate.waiters_cv);
}

/* With g->gate.mu held (the keeper): bring swapped memory back, then open the gate if it may open. */
static void swap_in_and_open(struct nvshare_gpu *g)
{
    g->gate.swap_in_pending = 0;
    g->gate.swap_busy = 1;
    pthread_mutex_unlock(&g->gate.mu);
    nvshare_swap_lock(g);
    int rc = nvshare_swap_in(g);
    /* Open under swap_mu: an allocation decides "born swapped" under it by looking at the gate. */
    pthread_mutex_lock(&g->gate.mu);
    g->gate.swap_busy = 0;
    if (rc == 0 && should_open(g)) {
        set_open(g);
        pthread_cond_broadcast(&g->gate.waiters_cv);
    }
    nvshare_swap_unlock(g);
    nvshare_memory_report(g);
    if (rc == 0)
        return;
    g->gate.no_room_until = nvshare_now_ns() + NO_ROOM_RETRY_NS;
    if (g->gate.held) {
        /* Let the others run and free room; the waiting threads ask again after no_room_until. */
        g->gate.held = 0;
        g->gate.contended = g->gate.drop_pending = 0;
        g->gate.swap_out_bytes = 0;
        nvshare_outbox_gpu_event(NVSHARE_MSG_LOCK_RELEASED, g->uuid, NVSHARE_RELEASE_NO_ROOM, 0, NULL);
        pthread_cond_broadcast(&g->gate.waiters_cv);
    } else if (should_open(g)) {
        g->gate.swap_in_pending = 1;  /* ungated: keep trying */
    }
}

/* With g->gate.mu held, not holding the lock: PREPARE_SWAP_OUT. */
static void swap_out_now(struct nvshare_gpu *g)
{
    uint64_t want = g->gate.swap_now_bytes;
    g->gate.swap_now_bytes = 0;
    if (atomic_load(&g->gate.open) || g->gate.held) {
        /* Ungated work may run at any moment: its memory cannot move. Say so in the numbers. */
        nvshare_memory_report(g);
        return;
    }
    atomic_store(&g->gate.closing, 1);
    int drained = drain_with_deadline(g) == 0;
    want = g->gate.swap_cancel ? 0 : want;   /* RESUMED during the drain */
    g->gate.swap_cancel = 0;
    nvshare_swap_set_abort(g, 0);
    uint64_t moved = g->gate.held || !drained ? 0 : swap_out_unlocked(g, want);
    atomic_store(&g->gate.closing, 0);
    pthread_cond_broadcast(&g->gate.waiters_cv);
    if (!moved)
        nvshare_memory_report(g);
    nvshare_debug("gpu %s: asked to move %.1f MiB to host memory while waiting: moved %.1f MiB", g->uuid,
                  want / 1048576.0, moved / 1048576.0);
}

/* With g->gate.mu held, not holding the lock: PREFETCH. The memory comes back with the gate shut
 * (nothing of this process runs on g until its grant), so the grant finds it resident and opens at
 * once. Always answered, also when nothing could move: the daemon offers one PREFETCH at a time. */
static void prefetch_now(struct nvshare_gpu *g)
{
    uint64_t offered = g->gate.prefetch_bytes, moved = 0;
    g->gate.prefetch_bytes = 0;
    int stopped = 0;
    if (!g->gate.held && !atomic_load(&g->gate.open)) {
        g->gate.swap_busy = 1;   /* a grant meanwhile: the keeper brings the rest, then opens */
        pthread_mutex_unlock(&g->gate.mu);
        nvshare_swap_lock(g);
        stopped = nvshare_swap_prefetch(g, offered, &moved) != 0;
        nvshare_swap_unlock(g);
        pthread_mutex_lock(&g->gate.mu);
        g->gate.swap_busy = 0;
    }
    nvshare_memory_report_prefetched(g, stopped);
}

static void *keeper_main(void *arg)
{
    struct nvshare_gpu *g = arg;
    nvshare_in_hook = 1;  /* driver calls of this thread are the hook's own */
    pthread_mutex_lock(&g->gate.mu);
    for (;;) {
        while (!(g->gate.swap_in_pending || g->gate.prefetch_bytes || g->gate.swap_now_bytes ||
                 (g->gate.held && (g->gate.drop_pending || g->gate.contended))))
            pthread_cond_wait(&g->gate.keeper_cv, &g->gate.mu);
        if (g->gate.swap_in_pending) {
            uint64_t now = nvshare_now_ns();
            if (!g->gate.held && g->gate.no_room_until > now) {
                struct timespec until;
                deadline_after(&until, g->gate.no_room_until - now);
                pthread_cond_timedwait(&g->gate.keeper_cv, &g->gate.mu, &until);
                if (nvshare_now_ns() < g->gate.no_room_until)
                    continue;
            }
            swap_in_and_open(g);
            continue;
        }
        if (g->gate.prefetch_bytes) {
            prefetch_now(g);
            continue;
        }
        if (g->gate.swap_now_bytes) {
            swap_out_now(g);
            continue;
        }
        if (g->gate.drop_pending) {
            release_lock(g, NVSHARE_RELEASE_DROPPED);
            continue;
        }
        /* Contended: give it back once nothing entered the gate for the idle threshold and no
         * thread waits for this GPU's work; at once when the sampler saw it idle that long already
         * (a job asked while this one was in a pause: it need not wait one more threshold). */
        uint64_t threshold = contended_threshold(g);
        if (idle_for(g, threshold)) {
            release_lock(g, NVSHARE_RELEASE_IDLE);
            continue;
        }
        atomic_store(&g->gate.touched, 0);
        uint64_t window = nvshare_now_ns();
        struct timespec deadline;
        deadline_after(&deadline, threshold);
        int rc = 0;
        while (rc != ETIMEDOUT && g->gate.held && g->gate.contended && !g->gate.drop_pending)
            rc = pthread_cond_timedwait(&g->gate.keeper_cv, &g->gate.mu, &deadline);
        if (!g->gate.held || !g->gate.contended || g->gate.drop_pending)
            continue;
        /* An open capture is work in progress too: it will launch what it records. So is a thread
         * waiting in cuCtx/Stream/EventSynchronize: its kernels still run. Counted idle, a
         * compute-bound job gave the GPU back in every step's synchronise (20 ms steps, 137
         * hand-overs in 4 s on the H100: 1.032x serial), not at the end of its turn. A synchronise
         * that ended within the window counts too: looked at only at the window's end, a training
         * whose synchronise outlasts the threshold (50 ms steps, 33 ms of it synchronising on the
         * fake driver) was found idle in the 0.2 ms between that synchronise and its next launch,
         * and handed over at step ends with its GPU busy all along. */
        if (!atomic_load(&g->gate.touched) && atomic_load(&g->gate.inside) == 0 && atomic_load(&g->gate.captures) == 0 &&
            atomic_load(&g->gate.syncing) == 0 && !synced_since(g, window))
            release_lock(g, NVSHARE_RELEASE_IDLE);
    }
    return NULL;
}

static void ensure_keeper(struct nvshare_gpu *g)
{
    if (g->gate.keeper_running)
        return;
    if (nvshare_start_thread(keeper_main, g, THREAD_STACK_BYTES) == 0)
        g->gate.keeper_running = 1;
    else
        nvshare_log("gpu %s: cannot start the hand-over thread; the lock is given back only on DROP_LOCK",
                    g->uuid);
}

/* ---- daemon messages (client thread) -------------------------------------------------------- */
void nvshare_gate_on_grant(struct nvshare_gpu *g, uint32_t flags, uint32_t switch_ms, uint64_t bytes)
{
    pthread_mutex_lock(&g->gate.mu);
    int bursts = (flags & NVSHARE_GRANT_SHARED) && (flags & NVSHARE_GRANT_BURSTS);
    int yields = !!(flags & NVSHARE_GRANT_YIELD);
    g->gate.last_yields = yields;
    if (g->gate.held && !g->gate.requested && !g->gate.drop_pending) {
        /* The grant of a lock held: only what it says of bursts and prompt ones changed. Its turn,
         * and a LOCK_CONTENDED it had, go on (the daemon counts them). */
        nvshare_burst_arm(g, bursts, yields);
        pthread_mutex_unlock(&g->gate.mu);
        nvshare_debug("gpu %s: lock granted again (%s%s)", g->uuid, bursts ? "bursts take turns" : "own bursts",
                      atomic_load(&g->burst.yields) ? ", waits out prompt bursts" : "");
        return;
    }
    /* The grant goes down the layers once: first the gate's own part, all of it here; then one call
     * to each part below that has something to do at a grant, memory.c, swap.c, burst.c, in that
     * order; then the gate opens (or the keeper brings memory back first). Each of them before the
     * gate opens, all under this mutex. */
    hold_lock(g);
    g->gate.requested = 0;
    handoff_forget(g);
    /* A PREPARE_SWAP_OUT not yet done, or being done, is overtaken by the grant: moving memory
     * out only to bring it back would stall this job (measured: 11 s for 22 GiB, pinning first).
     * Not yet done: its answer is a report; being done (swap_busy): it stops between chunks. */
    int unanswered_ask = g->gate.swap_now_bytes != 0 && !g->gate.swap_busy;
    g->gate.swap_now_bytes = 0;
    uint64_t swapped = nvshare_memory_on_grant(g, unanswered_ask);
    nvshare_swap_on_grant(g, g->gate.swap_busy, (flags & NVSHARE_GRANT_SWAP_AHEAD) != 0, bytes);
    /* Co-running: bursts take turns through the shared page. In exclusive turns the lock does.
     * Armed before the gate opens: the first thread through it begins a burst. */
    nvshare_burst_arm(g, bursts, yields);
    open_gate(g, swapped);
    pthread_mutex_unlock(&g->gate.mu);
    nvshare_debug("gpu %s: lock granted (%s%s, switch interval %u ms)", g->uuid,
                  !(flags & NVSHARE_GRANT_SHARED) ? "exclusive"
                  : atomic_load(&g->burst.armed) ? "shared, bursts take turns" : "shared",
                  atomic_load(&g->burst.yields) ? ", waits out prompt bursts" : "", switch_ms);
}

static void want_out(struct nvshare_gpu *g, uint64_t bytes)
{
    if (bytes > g->gate.swap_out_bytes)
        g->gate.swap_out_bytes = bytes;
}

void nvshare_gate_on_contended(struct nvshare_gpu *g, uint64_t bytes)
{
    pthread_mutex_lock(&g->gate.mu);
    if (g->gate.held) {
        want_out(g, bytes);
        g->gate.contended = 1;
        pthread_cond_signal(&g->gate.keeper_cv);
    }
    pthread_mutex_unlock(&g->gate.mu);
}

void nvshare_gate_on_drop(struct nvshare_gpu *g, uint32_t reason, uint64_t bytes)
{
    pthread_mutex_lock(&g->gate.mu);
    if (g->gate.held && reason == NVSHARE_DROP_TIMESLICE) {
        /* Others waited a whole interval and no pause was long enough: be quicker next time. */
        g->gate.idle_threshold_ns = g->gate.idle_threshold_ns / 2 < IDLE_MIN_NS ? IDLE_MIN_NS : g->gate.idle_threshold_ns / 2;
    }
    if (g->gate.held) {
        want_out(g, bytes);
        g->gate.drop_pending = 1;
        pthread_cond_signal(&g->gate.keeper_cv);
    }
    pthread_mutex_unlock(&g->gate.mu);
    nvshare_debug("gpu %s: drop requested (reason %u, %.1f MiB to move out)", g->uuid, reason,
                  bytes / 1048576.0);
}

void nvshare_gate_on_prepare_swap_out(struct nvshare_gpu *g, uint64_t bytes)
{
    pthread_mutex_lock(&g->gate.mu);
    if (g->gate.held) {
        want_out(g, bytes);  /* moved at the next release */
    } else if (bytes) {
        g->gate.swap_now_bytes = bytes > g->gate.swap_now_bytes ? bytes : g->gate.swap_now_bytes;
        ensure_keeper(g);
        pthread_cond_signal(&g->gate.keeper_cv);
    }
    pthread_mutex_unlock(&g->gate.mu);
}

void nvshare_gate_on_prefetch(struct nvshare_gpu *g, uint64_t bytes)
{
    pthread_mutex_lock(&g->gate.mu);
    int answer = 1;
    if (bytes && !g->gate.held && !atomic_load(&g->gate.open)) {
        g->gate.prefetch_bytes = bytes;
        ensure_keeper(g);
        pthread_cond_signal(&g->gate.keeper_cv);
        answer = 0;
    }
    pthread_mutex_unlock(&g->gate.mu);
    if (answer)   /* granted meanwhile: the grant brings all of it back */
        nvshare_memory_report_prefetched(g, 0);
}

/* The suspend that asked for this GPU's memory to move out is over (the job runs again): moving it
 * now only to bring it back at the next grant cost the H100 35 s for 63 GiB. Whatever is still on
 * the GPU stays; what moved comes back with the grant, as after any swap-out. */
void nvshare_gate_on_resumed(struct nvshare_gpu *g)
{
    pthread_mutex_lock(&g->gate.mu);
    int unanswered_ask = g->gate.swap_now_bytes != 0 && !g->gate.swap_busy;
    g->gate.swap_out_bytes = g->gate.swap_now_bytes = 0;
    if (g->gate.swap_busy)
        nvshare_swap_set_abort(g, 1);       /* stops between chunks */
    else if (atomic_load(&g->gate.closing))
        g->gate.swap_cancel = 1;            /* draining: the swap-out after the drain moves nothing */
    pthread_mutex_unlock(&g->gate.mu);
    if (unanswered_ask)
        nvshare_memory_report(g);           /* the answer to that PREPARE_SWAP_OUT: nothing moved */
    nvshare_debug("gpu %s: the job runs again: no more memory moves out for its suspend", g->uuid);
}

void nvshare_gate_on_handoff(struct nvshare_gpu *g, uint32_t role, int fd)
{
    pthread_mutex_lock(&g->gate.mu);
    if (role == NVSHARE_HANDOFF_FROM && g->gate.held) {
        close_fd(&g->gate.handoff_out_fd);
        g->gate.handoff_out_fd = fd;
        fd = -1;
    } else if (role == NVSHARE_HANDOFF_TO && !g->gate.held && g->gate.requested) {
        handoff_forget(g);
        g->gate.handoff_in_fd = fd;
        g->gate.handoff_gen++;
        fd = -1;
        pthread_cond_broadcast(&g->gate.waiters_cv);   /* a waiting thread starts to poll it */
    }
    pthread_mutex_unlock(&g->gate.mu);
    if (fd >= 0)
        close(fd);   /* not for us now (released meanwhile, or granted already) */
}

/* A REPLY to LOCK_REQUEST: this GPU is not the daemon's, or not this job's. Never block on it. */
void nvshare_gate_on_request_refused(uint32_t seq, int32_t status, const char *message)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_lock(&g->gate.mu);
        if (g->gate.requested && g->gate.request_seq == seq) {
            g->gate.requested = 0;
            atomic_store(&g->mode, GPU_PASS);
            open_gate(g, swapped_bytes(g));
            pthread_mutex_unlock(&g->gate.mu);
            char why[4 * 256];
            nvshare_escape(why, sizeof why, message);
            if (status == NVSHARE_ERR_NOGPU)
                nvshare_debug("gpu %s: not managed for this job (%s); not gated", g->uuid, why);
            else
                nvshare_log("gpu %s: lock request refused (status %d: %s); not gated", g->uuid,
                            status, why);
            return;
        }
        pthread_mutex_unlock(&g->gate.mu);
    }
}

/* Connection up: waiters ask again. Down: nobody holds anything; 'run' lets work pass meanwhile, but
 * only while the daemon is gone (nobody listens on its socket), never while it is only slow. */
void nvshare_gate_on_connection_change(int connected)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_lock(&g->gate.mu);
        if (atomic_load(&g->mode) != GPU_PASS) {
            g->gate.held = 0;
            g->gate.requested = 0;
            g->gate.contended = 0;
            g->gate.drop_pending = 0;
            g->gate.swap_in_pending = 0;
            g->gate.swap_out_bytes = 0;
            atomic_store(&g->gate.open, 0);
            nvshare_burst_arm(g, 0, 0);
            nvshare_burst_end(g);
            handoff_forget(g);
            close_fd(&g->gate.handoff_out_fd);
            if (!connected && nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN && nvshare_outbox_daemon_gone())
                open_gate(g, swapped_bytes(g));
        }
        pthread_cond_broadcast(&g->gate.waiters_cv);
        pthread_mutex_unlock(&g->gate.mu);
    }
}

/* The daemon refused this process as a client: gating would only block the job. */
void nvshare_gates_open_all(void)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_lock(&g->gate.mu);
        atomic_store(&g->mode, GPU_PASS);
        open_gate(g, swapped_bytes(g));
        pthread_mutex_unlock(&g->gate.mu);
    }
}

void nvshare_gate_pass_through(struct nvshare_gpu *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->gate.mu);
    atomic_store(&g->mode, GPU_PASS);
    open_gate(g, swapped_bytes(g));   /* memory of ours in host memory comes back first */
    pthread_mutex_unlock(&g->gate.mu);
}

void nvshare_gate_note_demand(struct nvshare_gpu *g, uint64_t idle_since_ns, uint64_t gap_mean_ns,
                              unsigned busy_ppm)
{
    atomic_store_explicit(&g->gate.idle_since_ns, idle_since_ns, memory_order_relaxed);
    atomic_store_explicit(&g->gate.gap_mean_ns, gap_mean_ns, memory_order_relaxed);
    atomic_store_explicit(&g->gate.busy_ppm, busy_ppm, memory_order_relaxed);
}

/* The child of fork holds no lock and has no threads but this one. */
void nvshare_gate_after_fork(void)
{
    pthread_mutex_init(&capture_mu, NULL);
    n_captures = 0;
    atomic_store(&nvshare_tl_capturing, 0);
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_init(&g->gate.mu, NULL);
        nvshare_cond_init(&g->gate.waiters_cv);
        nvshare_cond_init(&g->gate.keeper_cv);
        nvshare_cond_init(&g->gate.drain_cv);
        nvshare_gate_note_demand(g, 0, 0, 0);   /* the child's sampler starts afresh */
        g->gate.held = g->gate.requested = g->gate.waiters = g->gate.contended = g->gate.drop_pending = 0;
        g->gate.swap_in_pending = g->gate.swap_busy = g->gate.swap_cancel = 0;
        g->gate.swap_out_bytes = g->gate.swap_now_bytes = g->gate.prefetch_bytes = g->gate.no_room_until = 0;
        g->gate.keeper_running = 0;
        g->gate.drainer_running = 0;
        /* Copies of the parent's hand-over eventfds: not this process's to write or wait on. */
        close_fd(&g->gate.handoff_in_fd);
        close_fd(&g->gate.handoff_out_fd);
        g->gate.handoff_polling = g->gate.handoff_on_drain = 0;
        g->gate.drain_state = DRAIN_IDLE;
        atomic_store(&g->gate.captures, 0);
        g->gate.last_release_idle = g->gate.quick_reasks = 0;
        atomic_store(&g->gate.inside, 0);
        atomic_store(&g->gate.beginning, 0);   /* a parent's thread on its way in is not the child's */
        atomic_store(&g->gate.closing, 0);
        if (atomic_load(&g->mode) == GPU_GATED)
            atomic_store(&g->mode, GPU_UNKNOWN);
        int managed = nvshare_cfg.active && nvshare_gpu_is_managed(g->uuid);
        atomic_store(&g->mode, managed ? GPU_UNKNOWN : GPU_PASS);
        atomic_store(&g->gate.open, managed ? 0 : 1);   /* shut until the child's own connection says */
    }
}
