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
 *
 * Prompt bursts (issue 27: a request served, an interactive command). A co-runner whose own bursts
 * are short and rare (PROMPT_BURST_MAX_NS, PROMPT_BUSY_MAX_PPM, as demand.c measures them), or that
 * serves requests (its gaps as irregular as random arrivals, issue 42: SERVE_*), does not wait for
 * the owner word: it writes on the page until when its burst should be done
 * (prompt_until) and runs at once. Everyone armed to yield (co-runners, and a turn holder whose
 * grant said YIELD) launches nothing new until that burst ends or that time passes: the request
 * then shares the GPU only with what the others had already queued, not with their next launches
 * too. Co-located beside a training, 3 ms requests took 18 ms at p99 on the H100 (6.5 ms alone).
 * A prompt job that finds another's prompt burst under way waits for that burst (at most its own
 * wait bound), not for the owner word, which a bursty co-runner's long burst may hold. A job that
 * writes prompt_until without end costs each yielding job at most YIELD_BUDGET_NS of every second
 * (then it ignores the page until that second ends), and no single wait is longer than
 * SERVE_HOLD_MAX_NS: the most an honest prompt job could ask. Before its class is known (4 bursts),
 * a job whose bursts so far look prompt runs them at once and has the others pace (provisional()).
 *
 * While prompt bursts are about (one began in the last CORUN_HOLD_RECENT_NS), the turn holder, which
 * takes no part in the owner word, also holds its queue on the GPU while a co-runner's ordinary burst
 * runs (corun_hold): each burst then has the GPU to one context besides the prompt job's, and a
 * request or a command meets the kernel under way of one job, not of two. On the H200 a 1 ms probe
 * beside a training and a bursty co-runner read 2.9-3.4 ms at p99 (1.1 alone): its slowest requests
 * waited for a kernel of each, time-sliced. The holder so gives way to a co-runner's burst rather than
 * sharing it half and half; the GPU's work is the same. Bounded as a prompt burst's hold is: at most
 * BURST_WAIT_MAX_NS per burst, at most CORUN_BUDGET_NS of each second, so that a co-runner that keeps
 * the owner word costs the holder what co-running with it would. A prompt job that waits its turn
 * behind another's prompt burst says until when it may wait (prompt_next_until): the others stay held
 * from the one burst to the next; before, they launched a kernel in between (mix8's probes on the H200).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
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
/* Prompt: mean burst at most 12 ms, busy at most 40 % (a served request, a command at a prompt; not
 * issue 27's bursty job, 28 ms bursts at 35 %, nor a training). As demand.c measures them: in 2 ms
 * samples, and stretched by the co-runners a request shares the GPU with until it is prompt. On the
 * H100 with 10 ms and 25 %, 3 ms requests every 30 ms beside a training were served no faster than
 * with prompt bursts off (p99 18.5 ms and 18.6), where a 1 ms probe's p99 fell from 9.5 to 3.5 ms. */
#define PROMPT_BURST_MAX_NS 12000000ull
#define PROMPT_BUSY_MAX_PPM 400000u
/* Once prompt, a job stays so until its bursts pass 20 ms or its busy share 50 %: beside two
 * trainings and a bursty job on the H200 a server's 3 ms requests read 12.1 ms at times (requests
 * arriving close together make one burst, each stretched by the others' time-slices), and each
 * time its requests waited like any burst. A bursty job of 28 ms bursts never enters. */
#define PROMPT_STAY_BURST_MAX_NS 20000000ull
#define PROMPT_STAY_BUSY_MAX_PPM 500000u
/* Either way only once its mean is of a few bursts: a first one cut short (start-up, a loaded CPU's
 * late samples) made a bursty job of 20 ms bursts read 11 ms and run its next bursts as prompt. */
#define PROMPT_MIN_BURSTS 4
/* A prompt burst is announced for 4 of its mean lengths (it runs beside what the others queued
 * before it), 2 to 20 ms. */
#define PROMPT_HOLD_FACTOR 4
#define PROMPT_HOLD_MIN_NS 2000000ull
#define PROMPT_HOLD_MAX_NS 20000000ull
/* A server (issue 42): its gaps vary as random arrivals do (the mean deviation of a gap from the
 * mean before it, over that mean: ~0.74 for Poisson arrivals, near 0 for a training's fixed
 * pauses; SERVE_SPREAD_STAY once it is one), from NVSHARE_SPREAD_MIN_GAPS gaps on, counting the one that
 * ends as a burst begins (a server's first gap is the wait after its warm-up: its second request is
 * the first to count as a server's; prompt ones from its fourth burst, PROMPT_MIN_BURSTS, as any
 * job's, provisional() before), and busy no more than a prompt job. Its bursts are prompt whatever their
 * length: a request's length is the model's, and the mean still counts a warm-up's long burst for
 * several requests. On the H200 a CUDA-graph decoder's 9 ms requests read 23-38 ms beside a
 * PyTorch training (each stretched by the training's time-slices), over the 12 ms line: the
 * training neither yielded nor paced, and the server's p99 was 3.6x its p99 alone (co-located
 * 2.0x). What a job that is not one costs the others is bounded as for any: the hold, and
 * YIELD_BUDGET_NS. NVSHARE_PROMPT_BURSTS=short: no server's bursts are prompt. */
#define SERVE_SPREAD 0.5
#define SERVE_SPREAD_STAY 0.375
/* Sharing stretches a server's requests, and its class must hold through that (issue 42). On the
 * H200 (the fifth session of 2026-11-29) a model.generate server, 28 % busy alone, read 54-55 %
 * busy beside a training, over the 50 % a prompt job may stay at, and its requests ran as ordinary
 * bursts beside the training's whole queue: p99 2.9x its p99 alone (co-located 2.0x). In the same
 * call, with the rule before the early bursts, its bursts merged (bursts 250 ms, gaps 54 ms) and the
 * gaps read regular for a while: the daemon made it take turns. So a server stays one for
 * SERVE_STAY_NS after its gaps last said so, and stays prompt up to SERVE_STAY_BUSY_MAX_PPM busy (the
 * daemon's line for a turn-taker); what that costs the others is still their yield budget, half of
 * each second. nvshare_slurm/policy/demand.py keeps the same two rules. */
#define SERVE_STAY_NS 5000000000ull
#define SERVE_STAY_BUSY_MAX_PPM 800000u
/* ... and only once its work has been sampled for a second (its busy share is then of a whole
 * second, not of its start): on the H200 a PyTorch training's start-up (imports, set-up, first
 * steps) read busy 42 % with irregular gaps and climbed past 50 % within half a second. In a run
 * where a server's second burst could already be prompt, the graph decoder beside it had a request
 * of 200 ms (the longest hold) as that training started: most likely the training was taken for a
 * server and its 46 ms bursts held the decoder (that run had no debug logs). */
#define SERVE_SEEN_NS 1000000000ull
/* ... and a server's bursts become prompt only while their mean is at most SERVE_BURST_MAX_NS (the
 * longest a prompt burst is held for) and its last burst, begin to end as burst.c saw it, ran at
 * most SERVE_SPAN_MAX_NS (the longest a burst waits for another's); once prompt, any length: a
 * request's length is the model's. On the H200 a PyTorch training that stepped 2 s and paused 2 s in
 * turn read busy 11 % after each pause, its gaps as irregular as a server's (spread 0.66-1.84): its
 * steps, 440-720 ms bursts as demand.c measures them, ran as prompt ones until its busy share passed
 * 80 %; generate beside it waited for them and its queue was never held (median 94 ms beside the
 * steps, 43 ms beside the pauses). With the mean's line alone it was still taken for one once, at
 * 187 ms; its steps run 118 ms each. The servers measured there read 3-10 ms (38 ms the longest, a
 * graph decoder stretched beside a training). A server's warm-up weighs on the mean for a few
 * requests and on the last burst for one: a 200 ms warm-up burst before 20 ms requests leaves the
 * first request ordinary. */
#define SERVE_BURST_MAX_NS NVSHARE_SERVE_HOLD_MAX_NS
#define SERVE_SPAN_MAX_NS BURST_WAIT_MAX_NS
/* A server's burst is announced for up to 200 ms (4 of its mean lengths): a generate request of
 * 42 ms alone, or two that arrived together. */
#define SERVE_HOLD_MAX_NS NVSHARE_SERVE_HOLD_MAX_NS
#define YIELD_WINDOW_NS 1000000000ull
/* Half of each second at most: what a prompt job may be busy (PROMPT_STAY_BUSY_MAX_PPM; a server
 * may stay prompt busier, SERVE_STAY_BUSY_MAX_PPM, and is yielded to this much). With 30 % a
 * server's requests that arrived close together used the budget up, and the rest of that second's
 * requests ran beside the training's whole steps. */
#define YIELD_BUDGET_NS 500000000ull
/* The turn holder's hold for co-runners' ordinary bursts (see the header): only while a prompt burst
 * began in the last 2 s (an interactive command every second, a server), at most a co-runner's wait
 * for another's burst per burst, at most half of each second. */
#define CORUN_HOLD_RECENT_NS 2000000000ull
#define CORUN_HOLD_MAX_NS BURST_WAIT_MAX_NS
#define CORUN_BUDGET_NS 500000000ull
/* A prompt job waiting its turn claims the others' hold until its wait's end and this much more (it
 * announces its own burst at once then). */
#define PROMPT_NEXT_MARGIN_NS 1000000ull
/* Leaks (hold.c, NVSHARE_PROMPT_LEAK_MS): a holder lets one segment of its work pass every period
 * while a prompt job's burst launches, only into bursts of this mean length or more (a segment, up
 * to a long kernel of 1.4 ms, then delays the burst's end by a fraction of it at most). */
#define LEAK_BURST_MIN_NS 3000000ull
/* A prompt job whose bursts come in trains (LINGER_TRAIN_MIN_PPM of its gaps shorter than
 * LINGER_GAP_MAX_NS: model.generate's tokens, each ended by a synchronise, 0.6-1.6 ms apart on the
 * H200) keeps the others held after a burst for 1.5 of its short gaps' mean and LINGER_MARGIN_NS, at
 * most LINGER_GAP_MAX_NS (NVSHARE_PROMPT_LINGER=off: not): let go between two tokens, the training
 * ran a kernel (a GEMM of 1.0-1.4 ms) that the next token waited for, at each of them. */
#define LINGER_GAP_MAX_NS 3000000ull
#define LINGER_TRAIN_MIN_PPM 500000u
#define LINGER_MARGIN_NS 300000ull
/* ... and whose bursts after a long gap are followed by a short one: LONE_MAX_PPM at most of them
 * alone (their next gap long too), a running mean of weight LONE_WEIGHT. A train's first token always
 * has another after it; a server of single requests under Poisson arrivals has runs of requests that
 * queued (gaps of a few us) after one in 2-4 of its lone ones. By the share of short gaps alone (at
 * NVSHARE_RUN_WEIGHT) two queued in a row took its bursts for trains, so its queued requests got leaks
 * (on a loaded 2-core host, 6-9 of 20 in a run; in a model of utilisation 0.2-0.4, 36-70 % of them);
 * with this 2-11 %, and a train still reads as one at once. */
#define LONE_MAX_PPM 250000u
#define LONE_WEIGHT 0.125
/* A prompt burst that begins less than this after its job's burst before ended is a request that
 * queued behind that one (a batch-1 CNN's next request on the H200: about 9 us after), unless its job's
 * bursts come in trains (a token's gap is that short too): hold.c's leaks may skip it. */
#define QUEUED_GAP_NS 1000000ull

NVSHARE_TLS int nvshare_tl_launch_held;

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
        /* One thread now: every count and wait starts afresh, disarmed; the page stays mapped. */
        struct nvshare_burst_state *b = &nvshare_gpus[i].burst;
        struct nvshare_burst_page *page = atomic_load(&b->page);
        memset(b, 0, sizeof *b);
        atomic_store(&b->page, page);
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

static int looks_prompt(struct nvshare_gpu *g);
static int early_class(struct nvshare_gpu *g);

/* prompt_seq moves, and whoever sleeps on it wakes: the hold watchers (hold.c), prompt jobs waiting
 * their turn, yields on the host. */
static void prompt_wake(struct nvshare_burst_page *p)
{
    atomic_fetch_add(&p->prompt_seq, 1);
    if (atomic_load(&p->prompt_waiters))
        futex(&p->prompt_seq, FUTEX_WAKE, 0x7fffffff, NULL);
}

/* *word becomes v unless it is later already (another's claim stands); *cur: its value as read, then
 * as found. 1 when v was written. */
static int raise_to(_Atomic uint64_t *word, uint64_t *cur, uint64_t v)
{
    while (*cur < v && !atomic_compare_exchange_weak(word, cur, v))
        ;
    return *cur < v;
}

/* A prompt burst begins, or one that may be (provisional): the others pace (pace.c) and, while it
 * is recent, the turn holder gives way to co-runners' bursts (corun_hold). */
static void mark_prompts(struct nvshare_burst_page *p, uint64_t now)
{
    atomic_store_explicit(&p->prompt_began_ns, now, memory_order_relaxed);
    atomic_fetch_add(&p->prompt_seq, 1);
}

static int prompts_recent(struct nvshare_burst_page *p, uint64_t now, uint64_t window_ns)
{
    uint64_t began = atomic_load_explicit(&p->prompt_began_ns, memory_order_relaxed);
    return began && (began > now || now - began < window_ns);
}

/* The owner word was taken or let go while prompt bursts are about: the turn holder's watcher
 * (hold.c, sleeping on prompt_seq) looks again. */
static void wake_holders(struct nvshare_burst_page *p)
{
    if (prompts_recent(p, nvshare_now_ns(), CORUN_HOLD_RECENT_NS))
        prompt_wake(p);
}

/* Until when the others hold for prompt bursts: the one under way, or one that waits its turn. */
static uint64_t announced(struct nvshare_burst_page *p)
{
    uint64_t until = atomic_load(&p->prompt_until), next = atomic_load(&p->prompt_next_until);
    return until > next ? until : next;
}

void nvshare_burst_arm(struct nvshare_gpu *g, int bursts, int yields)
{
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    int page = p != NULL;
    int was = atomic_exchange(&g->burst.armed, bursts && page);
    /* Co-running from now on, with bursts that are (or may be) prompt: the others pace from their
     * next launch, so that its first bursts beside them do not meet whole steps queued. */
    if (bursts && page && !was && (looks_prompt(g) || early_class(g)))
        mark_prompts(p, nvshare_now_ns());
    int yields_now = (bursts || yields) && page;
    /* Told to yield while a co-runner's prompt burst runs (a turn passed on by hand-over, a grant
     * that says YIELD again): hold.c's watcher looked at that burst while this job did not yield,
     * and sleeps until it ends. Woken, it holds the queue now: on the H200 a turn that began just
     * as a request did ran 7.7 ms of its kernels beside it (mix8, its slowest request). */
    if (!atomic_exchange(&g->burst.yields, yields_now) && yields_now &&
        atomic_load(&p->prompt_until) > nvshare_now_ns())
        futex(&p->prompt_seq, FUTEX_WAKE, 0x7fffffff, NULL);
}

/* The gaps' spread and how many gaps it is of, counting the one under way when this process has been
 * idle since `idle_since` (a burst begins at `now`: that gap ends). */
static double gaps_spread(struct nvshare_gpu *g, uint64_t now, uint64_t idle_since, unsigned *gaps)
{
    double mean = (double)atomic_load_explicit(&g->burst.gap_ns, memory_order_relaxed);
    double dev = (double)atomic_load_explicit(&g->burst.gap_dev_ns, memory_order_relaxed);
    unsigned n = atomic_load_explicit(&g->burst.gaps, memory_order_relaxed);
    if (idle_since && now > idle_since) {
        nvshare_gaps_add(&mean, &dev, (double)(now - idle_since));
        n++;
    }
    *gaps = n;
    return mean > 0 ? dev / mean : 0;
}

/* Is this process a server (SERVE_*) now? Kept in burst.serving. Never with NVSHARE_PROMPT_BURSTS=
 * short or off. */
static int serves_now(struct nvshare_gpu *g, uint64_t now, uint64_t idle_since)
{
    unsigned gaps = 0;
    double spread = gaps_spread(g, now, idle_since, &gaps);
    int was = atomic_load_explicit(&g->burst.serving, memory_order_relaxed);
    int on = nvshare_cfg.prompt_bursts == PROMPT_ON;
    int says = on && gaps >= NVSHARE_SPREAD_MIN_GAPS &&
               atomic_load_explicit(&g->burst.seen_ns, memory_order_relaxed) >= SERVE_SEEN_NS &&
               spread >= (was ? SERVE_SPREAD_STAY : SERVE_SPREAD);
    uint64_t t = now ? now : nvshare_now_ns();
    if (says)
        atomic_store_explicit(&g->burst.served_ns, t, memory_order_relaxed);
    uint64_t last = atomic_load_explicit(&g->burst.served_ns, memory_order_relaxed);
    int is = says || (on && was && last && t - last < SERVE_STAY_NS);
    atomic_store_explicit(&g->burst.serving, is, memory_order_relaxed);
    return is;
}

void nvshare_burst_note_demand(struct nvshare_gpu *g, const struct nvshare_burst_demand *d)
{
    atomic_store_explicit(&g->burst.gap_ns, d->gap_ns, memory_order_relaxed);
    atomic_store_explicit(&g->burst.gap_dev_ns, d->gap_dev_ns, memory_order_relaxed);
    atomic_store_explicit(&g->burst.gaps, d->gaps, memory_order_relaxed);
    atomic_store_explicit(&g->burst.idle_since, d->idle_since, memory_order_relaxed);
    atomic_store_explicit(&g->burst.seen_ns, d->seen_ns, memory_order_relaxed);
    atomic_store_explicit(&g->burst.bursts, d->bursts, memory_order_relaxed);
    atomic_store_explicit(&g->burst.mean_ns, d->burst_ns, memory_order_relaxed);
    atomic_store_explicit(&g->burst.busy_ppm, d->busy_ppm, memory_order_relaxed);
    serves_now(g, 0, 0);
}

/* How long a burst waits for another's: about its own mean burst. */
static uint64_t wait_bound(struct nvshare_gpu *g)
{
    uint64_t mean = atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed);
    if (!mean)
        return BURST_WAIT_UNKNOWN_NS;
    uint64_t b = (uint64_t)(mean * BURST_WAIT_FACTOR);
    return b < BURST_WAIT_MIN_NS ? BURST_WAIT_MIN_NS : b > BURST_WAIT_MAX_NS ? BURST_WAIT_MAX_NS : b;
}

/* Sleeps on a page's futex word while it still reads seq, at most left_ns, counted in waiters (a
 * hint for whoever bumps the word). */
static void page_wait(_Atomic uint32_t *word, _Atomic uint32_t *waiters, uint32_t seq, uint64_t left_ns)
{
    struct timespec ts = {(time_t)(left_ns / 1000000000ull), (long)(left_ns % 1000000000ull)};
    atomic_fetch_add(waiters, 1);
    futex(word, FUTEX_WAIT, seq, &ts);
    atomic_fetch_sub(waiters, 1);
}

/* A wait for another's burst ran out. The third in a row (a page that never frees: a dead or
 * hostile co-runner) stops this job looking at the page for BURST_IGNORE_NS. */
static void vain_wait(struct nvshare_gpu *g, uint64_t now, const char *whose)
{
    if (++g->burst.timeouts_row < BURST_TIMEOUTS_IN_ROW)
        return;
    g->burst.timeouts_row = 0;
    g->burst.ignore_until = now + BURST_IGNORE_NS;
    nvshare_debug("gpu %s: waited in vain for %d %s in a row; not waiting for them for %.0f s", g->uuid,
                  BURST_TIMEOUTS_IN_ROW, whose, BURST_IGNORE_NS / 1e9);
}

/* A wait for another's burst ended: a long one is said in the debug log (where a request's time
 * went). */
static void waited(struct nvshare_gpu *g, uint64_t start, const char *whose)
{
    if (!nvshare_cfg.debug)
        return;
    uint64_t ns = nvshare_now_ns() - start;
    if (ns >= 1000000ull)
        nvshare_debug("gpu %s: waited %.1f ms for %s", g->uuid, ns / 1e6, whose);
}

/* ---- prompt bursts ---------------------------------------------------------------------------- */
static int serves(struct nvshare_gpu *g)
{
    return atomic_load_explicit(&g->burst.serving, memory_order_relaxed);
}

/* Are this process's bursts short and rare, or a server's: a mean burst measured, of at most
 * PROMPT_BURST_MAX_NS (for a server SERVE_BURST_MAX_NS, its last burst at most SERVE_SPAN_MAX_NS) and
 * PROMPT_BUSY_MAX_PPM busy, or the STAY limits for a job that stays prompt (any length and
 * SERVE_STAY_BUSY_MAX_PPM busy for a server)? Never with NVSHARE_PROMPT_BURSTS=off. */
static int light(struct nvshare_gpu *g, int stay)
{
    int server = serves(g);
    if (server && !stay && atomic_load_explicit(&g->burst.span_ns, memory_order_relaxed) > SERVE_SPAN_MAX_NS)
        return 0;
    uint64_t mean = atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed);
    uint64_t max_mean = server ? (stay ? UINT64_MAX : SERVE_BURST_MAX_NS)
                        : stay ? PROMPT_STAY_BURST_MAX_NS : PROMPT_BURST_MAX_NS;
    unsigned max_busy = !stay ? PROMPT_BUSY_MAX_PPM
                        : server ? SERVE_STAY_BUSY_MAX_PPM : PROMPT_STAY_BUSY_MAX_PPM;
    return nvshare_cfg.prompt_bursts && mean && mean <= max_mean &&
           atomic_load_explicit(&g->burst.busy_ppm, memory_order_relaxed) <= max_busy;
}

/* How long a prompt burst is announced for: PROMPT_HOLD_FACTOR of the mean burst, at least
 * PROMPT_HOLD_MIN_NS, at most `max`. */
static uint64_t announce_ns(struct nvshare_gpu *g, uint64_t max)
{
    uint64_t h = atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed) * PROMPT_HOLD_FACTOR;
    return h < PROMPT_HOLD_MIN_NS ? PROMPT_HOLD_MIN_NS : h > max ? max : h;
}

static uint64_t prompt_hold(struct nvshare_gpu *g)
{
    if (atomic_load_explicit(&g->burst.bursts, memory_order_relaxed) < PROMPT_MIN_BURSTS ||
        !light(g, atomic_load_explicit(&g->burst.prompt_kind, memory_order_relaxed)))
        return 0;   /* not prompt (or not measured enough yet, or NVSHARE_PROMPT_BURSTS=off) */
    return announce_ns(g, serves(g) ? SERVE_HOLD_MAX_NS : PROMPT_HOLD_MAX_NS);
}

/* A job whose class is not known yet (fewer than PROMPT_MIN_BURSTS bursts) but whose bursts so far
 * look prompt: it may well be. Its bursts tell the others that prompt bursts are about (they pace:
 * queue depth, not GPU time) and do not wait for the owner word, as co-location would not; the
 * others do not yield to them. On the H200 a server's first 4-6 requests were its slowest (10-22 ms
 * of service against 8-10 after), waiting for a bursty co-runner's owner word and beside a
 * training's whole step queued: they made its p99. With this, mix4's server read 10.3 ms at p99
 * against 16.8 without, in one call (mix8 12.9 against 11.9: within its spread). */
static int provisional(struct nvshare_gpu *g)
{
    return atomic_load_explicit(&g->burst.bursts, memory_order_relaxed) < PROMPT_MIN_BURSTS && light(g, 0);
}

/* Pacing alone was not enough: held on the GPU, the others' queues ran through those first bursts.
 * On the H200 (bench_mixes, the second call of 2026-11-29) a server's first 2-4 requests were still
 * its slowest, 6.0-9.6 ms against 3.0-4.6 after in serve2, 7.5-22.3 against at most 7.3 in mix4,
 * 9.0-12.7 in mix8, and a 1 ms probe's first three 4.9-5.9 ms against at most 2.8 after: they made
 * the p99 of mix4, mix8 and the probes. So (NVSHARE_PROMPT_EARLY=hold, the default) a provisional
 * burst is announced as a prompt one, for 4 of its mean lengths but at most EARLY_HOLD_MAX_NS, and
 * so is a job's very first burst, of unknown length, for EARLY_FIRST_NS: the others yield and hold
 * their queues for it. The page marks it early (prompt_early): a prompt job does not wait for it,
 * as it would for another prompt burst. What a job that is none costs the others is bounded:
 * PROMPT_MIN_BURSTS such bursts per process and GPU (burst.early_bursts), each held for at most
 * EARLY_HOLD_MAX_NS (EARLY_FIRST_NS the first), within each one's yield budget. 0: not early (or
 * NVSHARE_PROMPT_EARLY=pace). */
#define EARLY_FIRST_NS 4000000ull
#define EARLY_HOLD_MAX_NS 8000000ull
/* Its class is not known yet and it may be prompt (NVSHARE_PROMPT_EARLY=hold): fewer than
 * PROMPT_MIN_BURSTS bursts, none measured or light ones. Such a job's first shared grant tells the
 * others that prompt bursts may come (nvshare_burst_arm): their next launches carry waits, so that
 * its first burst finds their queues holdable. */
static int early_class(struct nvshare_gpu *g)
{
    return nvshare_cfg.prompt_early && nvshare_cfg.prompt_bursts &&
           atomic_load_explicit(&g->burst.bursts, memory_order_relaxed) < PROMPT_MIN_BURSTS &&
           (!atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed) || light(g, 0));
}

static uint64_t early_hold(struct nvshare_gpu *g)
{
    if (!early_class(g))
        return 0;
    if (!atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed))
        return atomic_load_explicit(&g->burst.bursts, memory_order_relaxed) ? 0 : EARLY_FIRST_NS;
    return announce_ns(g, EARLY_HOLD_MAX_NS);
}

/* prompt_hold(g) || provisional(g), in one look: the two differ in the burst count alone. */
static int looks_prompt(struct nvshare_gpu *g)
{
    return light(g, atomic_load_explicit(&g->burst.bursts, memory_order_relaxed) >= PROMPT_MIN_BURSTS &&
                        atomic_load_explicit(&g->burst.prompt_kind, memory_order_relaxed));
}

/* Another job's prompt burst runs: wait for it to end (its prompt_seq moves) or for the time it
 * announced, at most our own wait bound, as bursts take turns; never for the owner word, which a
 * bursty co-runner's long burst may hold: on the H200 a server's 3 ms request that found a probe's
 * burst under way waited 7-15 ms so, behind a bursty job's 28 ms burst. Waited in vain
 * BURST_TIMEOUTS_IN_ROW times in a row (a page that claims prompt bursts without end): the page is
 * not looked at for BURST_IGNORE_NS, as for the owner word. */
static void prompt_take_turn(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t now)
{
    if (now < g->burst.ignore_until)
        return;
    uint64_t start = now, deadline = now + wait_bound(g);
    /* The others stay held from that burst's end to ours (the later claim stands). */
    uint64_t claim = deadline + PROMPT_NEXT_MARGIN_NS, cur = atomic_load(&p->prompt_next_until);
    atomic_store(&g->burst.next_mine, raise_to(&p->prompt_next_until, &cur, claim) ? claim : 0);
    atomic_fetch_add(&g->burst.waiting, 1);   /* the demand sampler counts this as waiting */
    for (;;) {
        uint32_t seq = atomic_load(&p->prompt_seq);
        uint64_t until = atomic_load(&p->prompt_until);
        if (!until || now >= until || atomic_load(&p->prompt_early)) {
            g->burst.timeouts_row = 0;
            break;
        }
        if (now >= deadline) {
            vain_wait(g, now, "prompt bursts");
            break;
        }
        page_wait(&p->prompt_seq, &p->prompt_waiters, seq, (until < deadline ? until : deadline) - now);
        now = nvshare_now_ns();
    }
    atomic_fetch_sub(&g->burst.waiting, 1);
    if (!nvshare_cfg.debug)   /* waited() says nothing then: no text to make */
        return;
    char whose[96];
    snprintf(whose, sizeof whose, "another prompt burst (its job's span %.1f ms, this job's %.1f)",
             atomic_load_explicit(&p->prompt_span_ns, memory_order_relaxed) / 1e6,
             atomic_load_explicit(&g->burst.prompt_span_ns, memory_order_relaxed) / 1e6);
    waited(g, start, whose);
}

/* A burst of `span` from now ends before the prompt burst the page describes (its prompt_began_ns
 * and prompt_span_ns: the burst expected to end last; prompt_begin keeps it so) is expected to. */
static int ends_sooner(struct nvshare_burst_page *p, uint64_t now, uint64_t span)
{
    uint64_t began = atomic_load_explicit(&p->prompt_began_ns, memory_order_relaxed);
    uint64_t theirs = atomic_load_explicit(&p->prompt_span_ns, memory_order_relaxed);
    return span && began <= now && theirs > now - began && theirs - (now - began) > span;
}

/* A prompt burst much shorter than the one under way: that burst's job's mean span (the page's
 * prompt_span_ns) is CUT_IN_PCT % or more of this job's own, and more than this job's span of it is
 * still to come (from the page's prompt_began_ns). This burst then runs beside the rest of that one
 * rather than after it (NVSHARE_PROMPT_CUT_IN, on by default): the shorter burst waits for the GPU's
 * time-slices shared with that one's kernels under way, not for its whole rest, and the longer loses
 * about the shorter's length, as shortest-first would have it. On the H200 mix8's 1 ms probes
 * waited on the host through the server's 3 ms requests (3.2 ms, their slowest tenth;
 * bench/probe_overlap.py); with 200 % here, the probes' spans (a 1.6-1.8 ms median beside the
 * others) often missed the server's 4 ms. Bursts of about one length still take turns. The page is
 * not trusted: a span that claims a long burst makes the others run beside it, as they would with
 * prompt bursts off; a short one makes them wait as before. */
#define CUT_IN_PCT 150
static int cuts_in(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t now)
{
    uint64_t mine = atomic_load_explicit(&g->burst.prompt_span_ns, memory_order_relaxed);
    uint64_t span = atomic_load_explicit(&p->prompt_span_ns, memory_order_relaxed);
    return nvshare_cfg.prompt_cut_in && mine && span / CUT_IN_PCT >= mine / 100 &&
           (nvshare_cfg.prompt_cut_in == CUT_IN_ALWAYS || ends_sooner(p, now, mine));
}

/* Do this job's bursts come in trains (see LINGER_*)? */
static int in_trains(struct nvshare_burst_state *b)
{
    return atomic_load_explicit(&b->train_gap_ns, memory_order_relaxed) &&
           atomic_load_explicit(&b->train_ppm, memory_order_relaxed) >= LINGER_TRAIN_MIN_PPM &&
           atomic_load_explicit(&b->lone_ppm, memory_order_relaxed) < LONE_MAX_PPM;
}

/* A prompt burst begins: announce it (the later of ours and one under way) and run at once; `queued`:
 * it began right after this job's burst before (QUEUED_GAP_NS). */
static void prompt_begin(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t hold, int early,
                         int queued)
{
    uint64_t now = nvshare_now_ns(), until = now + hold;
    uint64_t cur = atomic_load(&p->prompt_until);
    if (!early || cur <= now)
        atomic_store(&p->prompt_early, (uint32_t)early);   /* an early one never hides a prompt one */
    raise_to(&p->prompt_until, &cur, until);
    atomic_store(&g->burst.prompt_mine, until);
    atomic_store(&g->burst.prompting, 1);
    atomic_store_explicit(&g->burst.prompt_began_mine, now, memory_order_relaxed);
    uint64_t span = atomic_load_explicit(&g->burst.prompt_span_ns, memory_order_relaxed);
    if (!ends_sooner(p, now, span)) {   /* the page describes the burst that should end last */
        atomic_store_explicit(&p->prompt_began_ns, now, memory_order_relaxed);
        atomic_store_explicit(&p->prompt_span_ns, span, memory_order_relaxed);
    }
    uint64_t next = atomic_exchange(&g->burst.next_mine, 0);
    if (next)   /* our claim while we waited our turn: prompt_until covers it from now */
        atomic_compare_exchange_strong(&p->prompt_next_until, &next, 0);
    atomic_store_explicit(&p->prompt_len_ns, atomic_load_explicit(&g->burst.mean_ns, memory_order_relaxed),
                          memory_order_relaxed);
    int train = in_trains(&g->burst);
    atomic_store_explicit(&p->prompt_train, (uint32_t)train, memory_order_relaxed);
    atomic_store_explicit(&p->prompt_queued, (uint32_t)(queued && !train), memory_order_relaxed);
    /* Wake whoever waits on prompt_seq: the co-runners' hold watchers (hold.c) hold their queued
     * work on the GPU from now; a prompt job waiting for another's burst looks again and waits on. */
    prompt_wake(p);
    /* The owner word too, when free: bursty co-runners then wait for us as for any burst. */
    uint32_t none = 0, me = my_token();
    if (atomic_compare_exchange_strong(&p->owner, &none, me))
        atomic_store(&g->burst.owner, 1);
}

/* A prompt (or early) burst begins. Another prompt burst runs: take turns with it first (two
 * short-burst jobs would otherwise both run at once, as plain co-location). */
static void prompt_run(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t now, uint64_t hold,
                       int early, int queued)
{
    uint64_t until = atomic_load(&p->prompt_until);
    if (until > now && until != atomic_load(&g->burst.linger_mine)) {   /* not our own linger */
        if (!cuts_in(g, p, now))
            prompt_take_turn(g, p, now);
        else
            nvshare_debug("gpu %s: runs beside a prompt burst of a %.1f ms span (this job's %.1f)", g->uuid,
                          atomic_load_explicit(&p->prompt_span_ns, memory_order_relaxed) / 1e6,
                          atomic_load_explicit(&g->burst.prompt_span_ns, memory_order_relaxed) / 1e6);
    }
    prompt_begin(g, p, hold, early, queued);
}

/* A burst of this job begins `gap` after its last one ended: the share of its gaps that are short
 * (a train of bursts: model.generate's tokens, each ended by a synchronise) and their mean, and the
 * share of its bursts after a long gap that were alone (LONE_*). Only this process's begin calls it. */
static void note_gap(struct nvshare_burst_state *b, uint64_t gap)
{
    int train = gap < LINGER_GAP_MAX_NS;
    double ppm = atomic_load_explicit(&b->train_ppm, memory_order_relaxed);
    atomic_store_explicit(&b->train_ppm, (unsigned)(ppm + NVSHARE_RUN_WEIGHT * (train * 1e6 - ppm)),
                          memory_order_relaxed);
    if (atomic_exchange_explicit(&b->after_long, !train, memory_order_relaxed)) {
        double lone = atomic_load_explicit(&b->lone_ppm, memory_order_relaxed);
        atomic_store_explicit(&b->lone_ppm, (unsigned)(lone + LONE_WEIGHT * (!train * 1e6 - lone)),
                              memory_order_relaxed);
    }
    if (train)
        atomic_store_explicit(&b->train_gap_ns,
                              (uint64_t)nvshare_run_mean((double)atomic_load(&b->train_gap_ns), (double)gap),
                              memory_order_relaxed);
}

/* How long the others stay held after a prompt burst of this job ends (see LINGER_*), 0: not. */
static uint64_t linger_ns(struct nvshare_gpu *g)
{
    uint64_t gap = atomic_load_explicit(&g->burst.train_gap_ns, memory_order_relaxed);
    if (!nvshare_cfg.prompt_linger || !in_trains(&g->burst))
        return 0;
    uint64_t linger = gap + gap / 2 + LINGER_MARGIN_NS;
    return linger < LINGER_GAP_MAX_NS ? linger : LINGER_GAP_MAX_NS;
}

/* A synchronise of this job counted on the page (prompt_syncing) no longer is. */
static void sync_unmark(struct nvshare_gpu *g, struct nvshare_burst_page *p)
{
    if (atomic_load_explicit(&g->burst.sync_marked, memory_order_relaxed) &&
        atomic_exchange(&g->burst.sync_marked, 0))
        atomic_fetch_sub(&p->prompt_syncing, 1);
}

/* ---- prompt bursts that come on time (expectations) ----------------------------------------------
 * Without preemption, a command that finds another job's kernel under way waits for its end: beside
 * an fp32 training's 1.0-1.4 ms GEMMs an interactive step's command every second read 0.4-0.8 ms over
 * its issue-42 target (alone + 1 ms) on the H200, and mix3's 1 ms probe found a co-runner's 1 ms kernel
 * under way at 99 % of its requests. No hold at a burst's begin can help: the GPU runs that kernel to
 * its end. But a job whose gaps between prompt bursts hardly vary (a command every second, a probe
 * every 100 ms: EXPECT_DEV_* against its mean gap) knows when its next burst should begin. At each
 * prompt burst's end it writes that time and the gaps' deviation into a slot of the page (its own, or
 * a free or past one), and wakes the others; each co-runner that yields holds its queue on the GPU
 * (hold.c) from its own drain time before it, the longest thing it may have under way (its longest
 * kernel with waits of its own, at least a segment, and the switch), and twice the deviation more,
 * until three deviations and EXPECT_LATE_NS after it. The burst then finds the GPU drained. A burst
 * that comes late finds the hold let go; one that comes inside the window keeps it, as a prompt burst's
 * hold. Held time counts against the yield budget as any hold for prompt bursts, so a page that claims
 * windows without end costs what one that claims prompt bursts without end does. A server's random
 * arrivals, and model.generate's trains of tokens, have gaps that vary: they say nothing. The cost is
 * the co-runners' GPU time in the window before the burst, each period. */
_Static_assert(sizeof(struct nvshare_burst_page) <= 4096, "the page fits the daemon's 4 KiB memfd (burstpage.py)");
#define EXPECT_MIN_GAPS 2                  /* the fewest gaps a pace is judged by (their bounds are tighter) */
#define EXPECT_GAP_MIN_NS 20000000ull      /* gaps shorter than this: not worth a hold each time */
#define EXPECT_GAP_MAX_NS 10000000000ull
#define EXPECT_DEV_MAX_NS 1000000ull       /* gaps that vary more than this (mean deviation) are not on time */
#define EXPECT_DEV_MAX_PCT 5               /* ... nor more than this share of their mean */
#define EXPECT_EARLY_DEVS 2
#define EXPECT_LATE_DEVS 3
#define EXPECT_LATE_NS 1000000ull
#define EXPECT_SEGMENT_NS 500000ull        /* the longest segment pace.c leaves between two waits */
#define EXPECT_SWITCH_NS 200000ull         /* the GPU's switch to the prompt job's context, about */
#define EXPECT_DRAIN_MAX_NS 20000000ull    /* a kernel longer than this is not waited out ahead */

/* A gap from this job's burst's end to its next one's begin. The pace is judged by the last
 * NVSHARE_PERIOD_GAPS gaps at most: a running deviation kept a command-a-second step's warm-up gaps
 * (tens of ms, then a second) for 20 gaps and more, past a 30 s window (the H200's interactive step). */
static void note_period(struct nvshare_burst_state *b, uint64_t gap)
{
    unsigned n = atomic_fetch_add_explicit(&b->period_gaps, 1, memory_order_relaxed);
    atomic_store_explicit(&b->period_ring[n % NVSHARE_PERIOD_GAPS], gap, memory_order_relaxed);
}

/* Do this job's last `k` gaps hardly vary? Their mean and mean deviation in *gap_out, *dev_out. With
 * fewer gaps the bounds are tighter (halved for each gap fewer than NVSHARE_PERIOD_GAPS): on the H200
 * the interactive step's first four commands, before its last four gaps were all steady ones, were
 * its slowest (3.6-4.5 ms against 3.1-3.3 after, and its p99 is made of them), while two gaps that
 * agree within a quarter of a millisecond and 1.25 % come by chance in about 2 % of a server's random
 * arrivals 30 ms apart, each costing the co-runners one window. */
static int on_pace(const struct nvshare_burst_state *b, unsigned n, unsigned k, uint64_t *gap_out, uint64_t *dev_out)
{
    uint64_t last[NVSHARE_PERIOD_GAPS], gap = 0, dev = 0;
    for (unsigned i = 0; i < k; i++)
        gap += last[i] = atomic_load_explicit(&b->period_ring[(n - 1 - i) % NVSHARE_PERIOD_GAPS],
                                              memory_order_relaxed);
    gap /= k;
    for (unsigned i = 0; i < k; i++)
        dev += last[i] > gap ? last[i] - gap : gap - last[i];
    dev /= k;
    unsigned tighter = NVSHARE_PERIOD_GAPS - k;
    *gap_out = gap;
    *dev_out = dev;
    return gap >= EXPECT_GAP_MIN_NS && gap <= EXPECT_GAP_MAX_NS && (dev << tighter) <= EXPECT_DEV_MAX_NS &&
           (dev << tighter) * 100 <= gap * EXPECT_DEV_MAX_PCT;
}

/* This job's prompt burst ended at `ended`: when its gaps hardly vary, say when the next is due. */
static void expect_next(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t ended)
{
    struct nvshare_burst_state *b = &g->burst;
    unsigned n = atomic_load_explicit(&b->period_gaps, memory_order_relaxed);
    if (!nvshare_cfg.prompt_expect || n < EXPECT_MIN_GAPS)
        return;
    uint64_t gap = 0, dev = 0;
    unsigned k = n < NVSHARE_PERIOD_GAPS ? n : NVSHARE_PERIOD_GAPS;
    while (k >= EXPECT_MIN_GAPS && !on_pace(b, n, k, &gap, &dev))
        k--;
    if (k < EXPECT_MIN_GAPS)
        return;
    uint32_t me = my_token();
    int slot = -1;
    for (int i = 0; i < NVSHARE_EXPECT_SLOTS && slot < 0; i++)
        if (atomic_load_explicit(&p->expect[i].token, memory_order_relaxed) == me)
            slot = i;
    for (int i = 0; i < NVSHARE_EXPECT_SLOTS && slot < 0; i++) {
        uint64_t at = atomic_load_explicit(&p->expect[i].at, memory_order_relaxed);
        uint64_t d = (uint64_t)atomic_load_explicit(&p->expect[i].dev_us, memory_order_relaxed) * 1000;
        if (!at || (at < ended && ended - at > EXPECT_LATE_DEVS * d + EXPECT_LATE_NS))   /* free, or past */
            slot = i;
    }
    if (slot < 0)
        return;
    if (!b->expect_said++)
        nvshare_debug("gpu %s: its prompt bursts come on time (a gap of %.1f ms, give or take %.3f): the others "
                      "hold their queues from a little before each", g->uuid, gap / 1e6, dev / 1e6);
    uint64_t span_us = atomic_load_explicit(&b->prompt_span_ns, memory_order_relaxed) / 1000;
    atomic_store_explicit(&p->expect[slot].token, me, memory_order_relaxed);
    atomic_store_explicit(&p->expect[slot].dev_us, (uint32_t)(dev / 1000), memory_order_relaxed);
    atomic_store_explicit(&p->expect_span_us[slot], span_us < UINT32_MAX ? (uint32_t)span_us : UINT32_MAX,
                          memory_order_relaxed);
    atomic_store(&p->expect[slot].at, ended + gap);
}

/* Is slot i another job's whose prompt bursts are much shorter than this job's own (the page's span
 * at most 100/CUT_IN_PCT of ours, as cuts_in has it the other way round)? A prompt job holds its queue
 * only for those (NVSHARE_PROMPT_SHORTER): two of about one length take turns as before. */
static int shorter_slot(struct nvshare_gpu *g, struct nvshare_burst_page *p, int i)
{
    uint64_t mine = atomic_load_explicit(&g->burst.prompt_span_ns, memory_order_relaxed);
    uint64_t theirs = (uint64_t)atomic_load_explicit(&p->expect_span_us[i], memory_order_relaxed) * 1000;
    return theirs && mine / CUT_IN_PCT >= theirs / 100 &&
           atomic_load_explicit(&p->expect[i].token, memory_order_relaxed) != my_token();
}

/* The hold this job (a co-runner) makes for the prompt bursts the page expects: 1 when one's window is
 * open now (a->until: its end), else a->look_by: when the next one opens (0: none). `shorter`: only
 * for those of jobs whose bursts are much shorter than this one's (shorter_slot). */
static int expect_hold(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t now, struct nvshare_hold_ask *a,
                       int shorter)
{
    if (!nvshare_cfg.prompt_expect)
        return 0;
    uint64_t drain = atomic_load_explicit(&g->hold.long_ns, memory_order_relaxed);
    drain = drain > EXPECT_SEGMENT_NS ? drain : EXPECT_SEGMENT_NS;
    drain = (drain < EXPECT_DRAIN_MAX_NS ? drain : EXPECT_DRAIN_MAX_NS) + EXPECT_SWITCH_NS;
    uint64_t until = 0, next = 0;
    for (int i = 0; i < NVSHARE_EXPECT_SLOTS; i++) {
        uint64_t at = atomic_load(&p->expect[i].at);
        uint64_t dev = (uint64_t)atomic_load_explicit(&p->expect[i].dev_us, memory_order_relaxed) * 1000;
        if (!at || dev > EXPECT_DEV_MAX_NS || at > now + EXPECT_GAP_MAX_NS ||   /* none, or not to be heeded */
            (shorter && !shorter_slot(g, p, i)))
            continue;
        uint64_t from = at - EXPECT_EARLY_DEVS * dev - drain, end = at + EXPECT_LATE_DEVS * dev + EXPECT_LATE_NS;
        /* A prompt job (shorter): through that burst's span too. A yielder's hold goes on as the one for
         * the burst's announcement once it begins; a prompt job cannot tell another's from its own. */
        if (shorter)
            end += (uint64_t)atomic_load_explicit(&p->expect_span_us[i], memory_order_relaxed) * 1000;
        if (end <= now)
            continue;
        if (from <= now)
            until = end > until ? end : until;
        else if (!next || from < next)
            next = from;
    }
    a->look_by = until ? 0 : next;
    if (!until)
        return 0;
    a->until = until;
    a->expect = 1;
    return 1;
}

static void prompt_end(struct nvshare_gpu *g, struct nvshare_burst_page *p)
{
    sync_unmark(g, p);
    if (!atomic_exchange(&g->burst.prompting, 0))
        return;
    uint64_t began = atomic_load_explicit(&g->burst.prompt_began_mine, memory_order_relaxed), ended = nvshare_now_ns();
    if (began && began <= ended)
        atomic_store_explicit(&g->burst.prompt_span_ns,
                              (uint64_t)nvshare_run_mean((double)atomic_load(&g->burst.prompt_span_ns),
                                                         (double)(ended - began)),
                              memory_order_relaxed);
    /* Not if another extended it. Lingering, the others stay held until the next burst of the train
     * is due (the wake makes their watchers look at the new end); not after a release (disarmed), and
     * only a job whose bursts are prompt ones by its class: a job's early bursts (a training's first
     * steps, back to back) would otherwise leave an announcement that it paces and holds for itself. */
    uint64_t mine = atomic_exchange(&g->burst.prompt_mine, 0);
    uint64_t linger = atomic_load(&g->burst.armed) && looks_prompt(g) ? linger_ns(g) : 0;
    uint64_t until = linger ? nvshare_now_ns() + linger : 0;
    atomic_store(&g->burst.linger_mine, until);
    atomic_compare_exchange_strong(&p->prompt_until, &mine, until);
    if (atomic_load(&g->burst.armed) && looks_prompt(g))
        expect_next(g, p, ended);
    prompt_wake(p);
}

/* The yield budget (YIELD_BUDGET_NS a second): when this second's runs out, `ongoing_ns` of a wait
 * under way counted too; 0 when it has (prompt bursts are then ignored until the second ends). */
static uint64_t budget_end(struct nvshare_gpu *g, uint64_t now, uint64_t ongoing_ns)
{
    if (now - atomic_load(&g->burst.yield_window_ns) >= YIELD_WINDOW_NS) {
        atomic_store(&g->burst.yield_window_ns, now);
        atomic_store(&g->burst.yielded_ns, 0);
        ongoing_ns = 0;   /* the new second counts from now */
    }
    uint64_t used = atomic_load(&g->burst.yielded_ns) + ongoing_ns;
    if (used < YIELD_BUDGET_NS)
        return now + YIELD_BUDGET_NS - used;
    uint64_t window_end = atomic_load(&g->burst.yield_window_ns) + YIELD_WINDOW_NS;
    atomic_store(&g->burst.yield_ignore_until, window_end > now ? window_end : now + YIELD_WINDOW_NS);
    nvshare_debug("gpu %s: waited %.0f ms of this second for co-runners' prompt bursts; "
                  "not waiting for them until it ends", g->uuid, YIELD_BUDGET_NS / 1e6);
    return 0;
}

void nvshare_burst_yield(struct nvshare_gpu *g)
{
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    if (!p || atomic_load_explicit(&g->burst.prompting, memory_order_relaxed))
        return;   /* our own burst is the prompt one */
    uint64_t now = nvshare_now_ns();
    if (now < atomic_load_explicit(&g->burst.yield_ignore_until, memory_order_relaxed))
        return;
    uint64_t start = now, cap = now + SERVE_HOLD_MAX_NS;
    atomic_fetch_add(&g->burst.waiting, 1);   /* the demand sampler counts this as waiting */
    for (;;) {
        uint32_t seq = atomic_load(&p->prompt_seq);
        uint64_t until = announced(p);
        if (!until || now >= until || now >= cap)
            break;
        uint64_t budget = budget_end(g, now, now - start);
        if (!budget)
            break;
        uint64_t end = until < cap ? until : cap;
        end = end < budget ? end : budget;
        page_wait(&p->prompt_seq, &p->prompt_waiters, seq, end - now);
        now = nvshare_now_ns();
    }
    atomic_fetch_sub(&g->burst.waiting, 1);
    atomic_fetch_add(&g->burst.yielded_ns, now - start);
    waited(g, start, "co-runners' prompt bursts");
}

int nvshare_burst_prompts_about(struct nvshare_gpu *g, uint64_t *now_out, uint64_t window_ns)
{
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    if (!p || !atomic_load_explicit(&g->burst.yields, memory_order_relaxed) || looks_prompt(g))
        return 0;
    uint64_t now = *now_out = nvshare_now_ns();
    if (now < atomic_load_explicit(&g->burst.yield_ignore_until, memory_order_relaxed))
        return 0;   /* a squatter used this second's budget: its page is not heeded */
    return window_ns == UINT64_MAX || atomic_load_explicit(&p->prompt_until, memory_order_relaxed) ||
           prompts_recent(p, now, window_ns);
}

int nvshare_burst_shorter_due(struct nvshare_gpu *g, uint64_t *now_out)
{
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    if (!nvshare_cfg.prompt_shorter || !nvshare_cfg.prompt_expect || !p ||
        !atomic_load_explicit(&g->burst.yields, memory_order_relaxed) || !looks_prompt(g))
        return 0;
    uint64_t now = *now_out = nvshare_now_ns();
    if (now < atomic_load_explicit(&g->burst.yield_ignore_until, memory_order_relaxed))
        return 0;
    for (int i = 0; i < NVSHARE_EXPECT_SLOTS; i++) {
        uint64_t at = atomic_load_explicit(&p->expect[i].at, memory_order_relaxed);
        if (at && at + EXPECT_LATE_NS > now && at <= now + EXPECT_GAP_MAX_NS && shorter_slot(g, p, i))
            return 1;
    }
    return 0;
}

void nvshare_burst_begin(struct nvshare_gpu *g)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g->burst.in_burst, &expected, 1))
        return;  /* another thread of this process began it */
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    uint64_t now = nvshare_now_ns();
    atomic_store_explicit(&g->burst.began_ns, now, memory_order_relaxed);
    uint64_t ended = atomic_load_explicit(&g->burst.ended_ns, memory_order_relaxed);
    int queued = 0;
    if (ended && now > ended) {
        note_gap(&g->burst, now - ended);
        note_period(&g->burst, now - ended);
        queued = now - ended < QUEUED_GAP_NS;
    }
    uint64_t idle_since = atomic_load_explicit(&g->burst.idle_since, memory_order_relaxed);
    if (p && idle_since)
        serves_now(g, now, idle_since);   /* the gap that ends here counts */
    uint64_t hold = p ? prompt_hold(g) : 0;
    if (p && (hold != 0) != atomic_load_explicit(&g->burst.prompt_kind, memory_order_relaxed)) {
        atomic_store_explicit(&g->burst.prompt_kind, hold != 0, memory_order_relaxed);
        nvshare_debug("gpu %s: its bursts are %s (mean %.1f ms, busy %u%%, gaps' spread %.2f%s)", g->uuid,
                      hold ? "prompt: the others launch nothing new while one runs" : "not prompt",
                      atomic_load(&g->burst.mean_ns) / 1e6, atomic_load(&g->burst.busy_ppm) / 10000,
                      gaps_spread(g, 0, 0, &(unsigned){0}), serves(g) ? ": a server" : "");
    }
    if (hold) {
        prompt_run(g, p, now, hold, 0, queued);
        return;
    }
    if (!p || now < g->burst.ignore_until)
        return;
    uint64_t early = g->burst.early_bursts < PROMPT_MIN_BURSTS ? early_hold(g) : 0;
    if (early) {
        if (!g->burst.early_bursts++)   /* counted however the counts come (a sampler that never reports) */
            nvshare_debug("gpu %s: its class is not known yet: its first bursts are announced as prompt ones, "
                          "for %.1f ms at most, %d bursts at most", g->uuid, early / 1e6, PROMPT_MIN_BURSTS);
        prompt_run(g, p, now, early, 1, 0);
        return;
    }
    uint32_t me = my_token();
    if (provisional(g)) {
        mark_prompts(p, now);   /* no wake: nobody waits for this one to end */
        uint32_t none = 0;
        if (atomic_compare_exchange_strong(&p->owner, &none, me))
            atomic_store(&g->burst.owner, 1);
        return;
    }
    uint64_t start = now, deadline = now + wait_bound(g);
    atomic_fetch_add(&g->burst.waiting, 1);
    for (;;) {
        uint32_t seq = atomic_load(&p->seq);
        uint32_t cur = 0;
        if (atomic_compare_exchange_strong(&p->owner, &cur, me) || cur == me) {
            atomic_store(&g->burst.owner, 1);
            g->burst.timeouts_row = 0;
            wake_holders(p);
            break;
        }
        now = nvshare_now_ns();
        if (now >= deadline) {
            /* Run beside it, as co-location would, and take the page over: an owner that died
             * holding it would otherwise cost every later burst of the others a whole wait. */
            if (atomic_compare_exchange_strong(&p->owner, &cur, me)) {
                atomic_store(&g->burst.owner, 1);
                wake_holders(p);
            }
            vain_wait(g, now, "co-runner bursts");
            break;
        }
        page_wait(&p->seq, &p->waiters, seq, deadline - now);
    }
    atomic_fetch_sub(&g->burst.waiting, 1);
    waited(g, start, "a co-runner's burst (the owner word)");
}

void nvshare_burst_end(struct nvshare_gpu *g)
{
    if (!atomic_exchange(&g->burst.in_burst, 0))
        return;
    uint64_t now = nvshare_now_ns(), began = atomic_load_explicit(&g->burst.began_ns, memory_order_relaxed);
    atomic_store_explicit(&g->burst.ended_ns, now, memory_order_relaxed);
    if (began && began <= now)
        atomic_store_explicit(&g->burst.span_ns, now - began, memory_order_relaxed);
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    if (p)
        prompt_end(g, p);
    if (!atomic_exchange(&g->burst.owner, 0) || !p)
        return;
    uint32_t me = my_token();
    atomic_compare_exchange_strong(&p->owner, &me, 0);
    atomic_fetch_add(&p->seq, 1);
    if (atomic_load(&p->waiters))
        futex(&p->seq, FUTEX_WAKE, 1, NULL);
    wake_holders(p);
}

void nvshare_burst_syncing(struct nvshare_gpu *g, int on)
{
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    if (!p)
        return;
    if (!on)
        sync_unmark(g, p);
    else if (atomic_load_explicit(&g->burst.prompting, memory_order_relaxed) &&
             !atomic_exchange(&g->burst.sync_marked, 1))
        atomic_fetch_add(&p->prompt_syncing, 1);
}

int nvshare_burst_prompt_syncing(struct nvshare_gpu *g)
{
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    return p && atomic_load_explicit(&p->prompt_syncing, memory_order_relaxed) != 0;
}

uint64_t nvshare_burst_prompt_len(struct nvshare_gpu *g)
{
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    return p ? atomic_load_explicit(&p->prompt_len_ns, memory_order_relaxed) : 0;
}

int nvshare_burst_prompt_train(struct nvshare_gpu *g)
{
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    return p && atomic_load_explicit(&p->prompt_train, memory_order_relaxed) != 0;
}

/* ---- held on the GPU (hold.c's watcher asks) ---------------------------------------------------- */
/* The hold for a co-runner's ordinary burst under way ends (or none runs): counted in the second's. */
static void corun_close(struct nvshare_burst_state *b, uint64_t now)
{
    if (b->corun_since) {
        b->corun_used_ns += now - b->corun_since;
        b->corun_since = 0;
    }
}

/* Should the turn holder hold its queue while a co-runner's ordinary burst runs (see the header)?
 * Only hold.c's watcher calls this (the corun_* fields are its own). */
static int corun_hold(struct nvshare_gpu *g, struct nvshare_burst_page *p, uint64_t now, struct nvshare_hold_ask *a)
{
    struct nvshare_burst_state *b = &g->burst;
    uint32_t owner = atomic_load(&p->owner);
    if (!nvshare_cfg.corun_hold || !owner || owner == my_token() || atomic_load(&b->armed) ||
        !atomic_load(&b->yields) || looks_prompt(g) || now < b->corun_ignore_until ||
        !prompts_recent(p, now, CORUN_HOLD_RECENT_NS)) {
        corun_close(b, now);
        return 0;
    }
    if (now - b->corun_window_ns >= YIELD_WINDOW_NS) {
        corun_close(b, now);
        b->corun_window_ns = now;
        b->corun_used_ns = 0;
    }
    uint32_t seq = atomic_load(&p->seq);   /* bumped at every burst's end: which burst this is */
    if (b->corun_done && seq == b->corun_done_seq) {
        corun_close(b, now);
        return 0;
    }
    b->corun_done = 0;
    if (seq != b->corun_seq || !b->corun_burst_start) {   /* another burst: its own 50 ms */
        corun_close(b, now);
        b->corun_seq = seq;
        b->corun_burst_start = now;
    }
    if (!b->corun_since)
        b->corun_since = now;
    uint64_t burst_held = now - b->corun_burst_start, used = b->corun_used_ns + (now - b->corun_since);
    if (burst_held >= CORUN_HOLD_MAX_NS) {
        corun_close(b, now);
        b->corun_done = 1;
        b->corun_done_seq = seq;
        return 0;
    }
    if (used >= CORUN_BUDGET_NS) {
        corun_close(b, now);
        b->corun_ignore_until = b->corun_window_ns + YIELD_WINDOW_NS;
        nvshare_debug("gpu %s: held %.0f ms of this second for co-runners' bursts; not holding for them until "
                      "it ends", g->uuid, CORUN_BUDGET_NS / 1e6);
        return 0;
    }
    uint64_t left = CORUN_HOLD_MAX_NS - burst_held;
    left = left < CORUN_BUDGET_NS - used ? left : CORUN_BUDGET_NS - used;
    a->end = a->until = now + left;
    a->corun = 1;
    return 1;
}

int nvshare_burst_hold_now(struct nvshare_gpu *g, uint64_t now, uint64_t held_ns, struct nvshare_hold_ask *a)
{
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    a->page = p != NULL;
    a->corun = 0;
    a->seq = p ? atomic_load(&p->prompt_seq) : 0;
    a->until = p ? announced(p) : 0;
    a->began = p ? atomic_load_explicit(&p->prompt_began_ns, memory_order_relaxed) : 0;
    a->end = 0;
    a->leak_from = a->len = 0;
    a->train = a->queued = 0;
    a->span = 0;
    a->why = NULL;
    a->expect = 0;
    a->look_by = 0;
    if (!p)
        return 0;
    int announced_now = a->until && now < a->until;
    if (!announced_now) {
        a->until = 0;
        if (!atomic_load(&g->burst.prompting) && corun_hold(g, p, now, a))
            return 1;
    }
    const char *why = !atomic_load(&g->burst.yields) ? "it did not yield"
                      : atomic_load(&g->burst.prompting) ? "its own burst was the prompt one"
                      : looks_prompt(g) ? "its own bursts are prompt"
                      : now < atomic_load(&g->burst.yield_ignore_until) ? "its yield budget was used up" : NULL;
    if (nvshare_cfg.prompt_shorter && why && atomic_load(&g->burst.yields) &&
        now >= atomic_load(&g->burst.yield_ignore_until) && (atomic_load(&g->burst.prompting) || looks_prompt(g))) {
        /* A prompt job: only ahead of a much shorter one's expected burst, its own under way or not. */
        a->why = NULL;
        if (!expect_hold(g, p, now, a, 1))
            return 0;
    } else if (!announced_now) {   /* none runs: one expected soon? (a->why stays NULL: none was announced) */
        if (why || !expect_hold(g, p, now, a, 0))
            return 0;
    } else {
        corun_close(&g->burst, now);
        a->why = why;
        if (why)
            return 0;
    }
    uint64_t budget = budget_end(g, now, held_ns);
    if (!budget) {
        a->why = "its yield budget was used up";
        return 0;
    }
    a->end = a->until < budget ? a->until : budget;
    if (a->expect)
        return 1;   /* no leaks: the window is for the GPU to drain */
    /* Leaks (hold.c): only into a prompt job's bursts of LEAK_BURST_MIN_NS or more (what a leaked
     * segment can cost it is small beside them), not its early ones, from a period into the burst. */
    uint64_t len = atomic_load_explicit(&p->prompt_len_ns, memory_order_relaxed);
    int leaky = nvshare_cfg.prompt_leak_ns && len >= LEAK_BURST_MIN_NS && !atomic_load(&p->prompt_early);
    /* Nor into a request that queued (NVSHARE_PROMPT_LEAK_QUEUED=off, the default): a server's p99 is
     * made of those, each waiting for the one before it and its own service too (a batch-1 CNN's on
     * the H200). */
    a->queued = leaky && atomic_load_explicit(&p->prompt_queued, memory_order_relaxed) != 0;
    if (leaky && (nvshare_cfg.prompt_leak_queued || !a->queued)) {
        uint64_t from = a->began && a->began <= now ? a->began : now;
        a->leak_from = from + nvshare_cfg.prompt_leak_ns;
        a->len = len;
        a->train = atomic_load_explicit(&p->prompt_train, memory_order_relaxed) != 0;
        a->span = atomic_load_explicit(&p->prompt_span_ns, memory_order_relaxed);
    }
    return 1;
}

void nvshare_burst_held(struct nvshare_gpu *g, uint64_t ns)
{
    atomic_fetch_add(&g->burst.yielded_ns, ns);
}

void nvshare_burst_wait_prompts(struct nvshare_gpu *g, uint32_t seq, uint64_t left_ns)
{
    struct nvshare_burst_page *p = atomic_load(&g->burst.page);
    if (p)
        page_wait(&p->prompt_seq, &p->prompt_waiters, seq, left_ns);
}
