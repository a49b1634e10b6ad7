/* hold.c: a job that yields to co-runners' prompt bursts keeps its work queued, and the GPU itself
 * holds that work while one runs.
 *
 * pace.c's host-side waits keep a job's queue short while prompt bursts are about, so that a request
 * shares the GPU with little of it; but a PyTorch training's short kernels run dry behind a shallow
 * queue (0.84-0.85 of its co-located steps/s beside PyTorch servers on the H200, issue 42), and the
 * request still shares the GPU with that queue. Instead each launch is left queued, and once its
 * launches since the last wait add up to a segment of GPU work, a cuStreamWaitValue32 on a word of
 * this process's pinned host memory goes into the stream before the next one: while the word is 0
 * the GPU passes it at once, while it is 1 the stream stops there, and the GPU's time-slices go to
 * the contexts that have work, the request's. A request then shares the GPU with at most the segment
 * under way, and when it ends the job's whole queue is there to run: on the H200 a 2 ms request
 * beside a job of 100 us kernels with 20 ms queued read 4.9 ms at p99 (4.6 alone, 11.4 co-located)
 * and the job kept 0.98 of its co-located kernels/s (bench/wait_gate_probe.cu).
 *
 * Only this process's thread writes 1 into the word (the watcher below): the burst page is shared
 * between tenants and not trusted, so a page that claims a prompt burst without end holds this job
 * at most as long as a yield on the host may wait (NVSHARE_SERVE_HOLD_MAX_NS at a time, the yield
 * budget in each second: burst.c answers). The watcher sleeps on the page's prompt_seq, which a
 * prompt burst's begin and end move (a futex: it writes the word some microseconds after). At exit
 * the word is let go first (atexit, registered after the CUDA runtime's own): a context torn down
 * with work held would otherwise wait for it. The word is mapped host memory of our own (mmap, then
 * registered), never freed: a context destroyed does not take it from under the watcher.
 *
 * Leaks: held for a whole request of a server bound by its host's launches (batch-1 model.generate),
 * a training lost the request, though the GPU idled most of it (0.83-0.89 of its co-located steps/s
 * on the H200). While such a request launches (burst.c says when: a long prompt burst whose job does
 * not wait in a synchronise), the watcher lets the word go until the GPU says it passed a wait, sets
 * it again, and once the GPU says the next wait is reached (one segment, or one long kernel, has
 * run), holds for NVSHARE_PROMPT_LEAK_MS before the next (see `leak`). With NVSHARE_PROMPT_LEAK_OPEN_MS
 * the word stays let go that long from the first segment's pass, so that a training's short kernels
 * between its GEMMs (segments of 0.2 ms beside generate's tokens) run more than one at a time, and
 * is set again as soon as the prompt job waits in a synchronise: what its synchronise waits for is
 * the segment under way, as with one segment.
 *
 * Leaks that end in time (NVSHARE_PROMPT_LEAK_FIT=on): a train of prompt bursts (model.generate's
 * tokens, each ended by a synchronise 2-3.5 ms after it began on the H200) waits at each synchronise
 * for what a leak let pass, an fp32 training's 1.0-2.0 ms GEMM. Each leak measures how long this
 * job's work ran on after its window shut (`leak_over_ns`, a maximum that decays), and a leak into
 * such a burst begins, and its window stays open, only while that much still ends before the burst's
 * synchronise is due: LEAK_FIT_SHARE_PCT of the prompt job's mean prompt burst from the burst's begin
 * (the page's prompt_began_ns and prompt_span_ns, untrusted: a lie leaks less or as before). Past
 * that the next leak waits for the next burst. Such leaks begin with the burst, not a period into
 * it: its own work the prompt job launches meanwhile queues behind the leaked segment, and runs
 * before its host reaches the synchronise. The run-on is measured only at leaks made: once it reads
 * long (3.4 ms on the H200, the GPU's time-slices shared with the prompt job's kernels), few leaks
 * are made and it falls slowly; that is why the setting is off by default (docs/design-hook.md).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>

#include "burst.h"
#include "driver.h"
#include "env.h"
#include "gpus.h"
#include "hold.h"

#define HOLD_LOOK_NS 100000000ull      /* no prompt burst runs: look again after this at the latest */
#define HOLD_NO_PAGE_NS 50000000ull    /* no page yet: look again after this */
#define HOLD_WORD_BYTES 4096
/* Leaks (NVSHARE_PROMPT_LEAK_MS, burst.c says when): the GPU writes a wait's number into `arrived`
 * as it comes to the wait (the segment before it has run), and into `passed` once past it (words of
 * the word's page, HOLD_ARRIVED_OFFSET and HOLD_PASSED_OFFSET). A leak lets the word go until `passed`
 * moves, at most LEAK_OPEN_MAX_NS, and sets it again: one segment of the queue runs (or one long
 * kernel), and the next leak comes a period after `arrived` says it has run (looked at every
 * LEAK_LOOK_NS, at most LEAK_SEGMENT_MAX_NS). */
#define HOLD_ARRIVED_OFFSET 64
#define HOLD_PASSED_OFFSET 128
/* A long kernel's wait (pace.c: one that runs a segment or longer) waits on the word at HOLD_LONG_OFFSET,
 * set and let go with the word, but let go by a leak only into a prompt burst the kernel fits: one
 * LEAK_LONG_FACTOR times its length (the longest such kernel seen), or a train of bursts (a request
 * of many: model.generate's tokens), with NVSHARE_PROMPT_LEAK_LONG=fit. */
#define HOLD_LONG_OFFSET 192
#define LEAK_LONG_FACTOR 4
#define LEAK_OPEN_MAX_NS 200000ull
#define LEAK_SEGMENT_MAX_NS 5000000ull
#define LEAK_LOOK_NS 5000L
#define LEAK_FIT_SHARE_PCT 75        /* a leak that ends in time ends by then into a train's burst */
#define LEAK_OVER_DECAY 8            /* leak_over_ns falls by 1/8 of its excess at each leak that ran on less */
/* The page is any co-runner's to write and to wake: a job that wakes its futex without end would
 * make the watcher look without end, a core of this job's CPU. Past HOLD_LOOKS_MAX looks in
 * HOLD_LOOKS_WINDOW_NS (a server of a thousand requests a second makes 20) it pauses
 * HOLD_FLOOD_PAUSE_NS before each look until the window ends: a prompt burst is then held up to
 * that much later. */
#define HOLD_LOOKS_MAX 50
#define HOLD_LOOKS_WINDOW_NS 10000000ull
#define HOLD_FLOOD_PAUSE_NS 1000000ull

/* Debug counts, said at exit with NVSHARE_LOG_LEVEL=debug: how long after a prompt burst began
 * (the page's prompt_began_ns) this job's word was set (0 when a co-runner's burst held it already),
 * and how often the watcher saw one announced and did not hold, by reason (a job between turns does
 * not yield, and has nothing running). Written by the GPU's watcher alone. On the H200 (mix3, mix4,
 * mix8) 88-97 % of the holds began within 0.1 ms. */
#define HOLD_LAG_BUCKETS 6
static const uint64_t lag_edges_ns[HOLD_LAG_BUCKETS - 1] = {50000, 100000, 200000, 500000, 1000000};
#define HOLD_WHY_MAX 4
enum { LEAK_PASSED, LEAK_NOTHING, LEAK_SYNCING, LEAK_LATE, LEAK_KINDS };
struct hold_counts {
    atomic_uint leaks[LEAK_KINDS];   /* leaks whose segment passed, that found none, not made (syncing) */
    atomic_uint kept_long;           /* leaks that kept long kernels held (they fit no such burst) */
    atomic_uint queued[2];           /* prompt bursts that queued (burst.c) held for: leaked into, not */
    atomic_uint open_us;             /* leaks open for several segments (NVSHARE_PROMPT_LEAK_OPEN_MS): how long */
    atomic_uint expect[2];           /* holds for a prompt burst expected (burst.c): it came while held, it did not */
    atomic_uint lag[HOLD_LAG_BUCKETS];
    atomic_uint not_held[HOLD_WHY_MAX];
    const char *_Atomic why[HOLD_WHY_MAX];
};
static struct hold_counts counts[NVSHARE_MAX_GPUS];

static void count_lag(struct nvshare_gpu *g, uint64_t now, uint64_t began)
{
    if (!nvshare_cfg.debug || !began || began > now)
        return;
    int b = 0;
    while (b < HOLD_LAG_BUCKETS - 1 && now - began >= lag_edges_ns[b])
        b++;
    atomic_fetch_add_explicit(&counts[g - nvshare_gpus].lag[b], 1, memory_order_relaxed);
}

static void count_not_held(struct nvshare_gpu *g, const char *why)
{
    if (!nvshare_cfg.debug || !why)
        return;
    struct hold_counts *c = &counts[g - nvshare_gpus];
    for (int i = 0; i < HOLD_WHY_MAX; i++) {
        const char *none = NULL;
        if (atomic_load(&c->why[i]) == why || atomic_compare_exchange_strong(&c->why[i], &none, why) ||
            none == why) {
            atomic_fetch_add_explicit(&c->not_held[i], 1, memory_order_relaxed);
            return;
        }
    }
}

static void say_counts(struct nvshare_gpu *g)
{
    struct hold_counts *c = &counts[g - nvshare_gpus];
    unsigned l[HOLD_LAG_BUCKETS], held = 0;
    for (int b = 0; b < HOLD_LAG_BUCKETS; b++)
        held += l[b] = atomic_load(&c->lag[b]);
    char why[256] = "";
    size_t at = 0;
    for (int i = 0; i < HOLD_WHY_MAX && atomic_load(&c->why[i]) && at < sizeof why; i++)
        at += (size_t)snprintf(why + at, sizeof why - at, "; not held while one was announced, %s: %u times",
                               atomic_load(&c->why[i]), atomic_load(&c->not_held[i]));
    if (held || why[0])
        nvshare_debug("gpu %s: held its queue %u times for prompt bursts, the word set after the burst began: within "
                      "0.05 ms %u, 0.1 ms %u, 0.2 ms %u, 0.5 ms %u, 1 ms %u, later %u%s", g->uuid, held, l[0], l[1],
                      l[2], l[3], l[4], l[5], why);
    if (atomic_load(&c->expect[0]) || atomic_load(&c->expect[1]))
        nvshare_debug("gpu %s: held its queue ahead of prompt bursts expected %u times: the burst began while "
                      "held %u times", g->uuid, atomic_load(&c->expect[0]) + atomic_load(&c->expect[1]),
                      atomic_load(&c->expect[0]));
    if (atomic_load(&c->leaks[LEAK_PASSED]) || atomic_load(&c->leaks[LEAK_NOTHING]) ||
        atomic_load(&c->leaks[LEAK_SYNCING]) || atomic_load(&c->leaks[LEAK_LATE]))
        nvshare_debug("gpu %s: leaks into prompt bursts: %u let a segment pass (open %.1f ms in all after the "
                      "first), %u found none waiting, %u not made (the prompt job waited in a synchronise), %u "
                      "not made (too late to end before its synchronise was due; ran on %.2f ms after a "
                      "window at most, lately); %u kept long kernels held; %u of %u requests that queued "
                      "held without leaks", g->uuid,
                      atomic_load(&c->leaks[LEAK_PASSED]), atomic_load(&c->open_us) / 1e3,
                      atomic_load(&c->leaks[LEAK_NOTHING]), atomic_load(&c->leaks[LEAK_SYNCING]),
                      atomic_load(&c->leaks[LEAK_LATE]), g->hold.leak_over_ns / 1e6,
                      atomic_load(&c->kept_long), atomic_load(&c->queued[1]),
                      atomic_load(&c->queued[0]) + atomic_load(&c->queued[1]));
}

static atomic_int exiting;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t setup_mu = PTHREAD_MUTEX_INITIALIZER;

/* The word a long kernel's wait waits on, beside `w`. */
static _Atomic(uint32_t) *long_word(_Atomic(uint32_t) *w)
{
    return w + HOLD_LONG_OFFSET / sizeof *w;
}

/* Both words let go. */
static void clear_words(_Atomic(uint32_t) *w)
{
    atomic_store(w, 0);
    atomic_store(long_word(w), 0);
}

static void let_go_all(void)
{
    atomic_store(&exiting, 1);
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n && i < NVSHARE_MAX_GPUS; i++) {
        _Atomic(uint32_t) *w = atomic_load(&nvshare_gpus[i].hold.word);
        if (w)
            clear_words(w);
    }
    for (int i = 0; nvshare_cfg.debug && i < n && i < NVSHARE_MAX_GPUS; i++)
        say_counts(&nvshare_gpus[i]);
}

static void register_exit(void)
{
    atexit(let_go_all);
}

/* Both words (with `keep_long`, the word alone: a leak that lets no long kernel pass). */
static void set_words(struct nvshare_gpu *g, uint32_t v, int keep_long)
{
    _Atomic(uint32_t) *w = atomic_load(&g->hold.word);
    if (v)
        atomic_fetch_add(&g->hold.holds, 1);   /* before the GPU can see it (pace.c's measurements) */
    if (!keep_long)
        atomic_store(long_word(w), v);
    atomic_store(w, v);
    if (v && atomic_load(&exiting))
        clear_words(w);   /* let_go_all ran meanwhile */
}

static void set_word(struct nvshare_gpu *g, uint32_t v)
{
    set_words(g, v, 0);
}

/* A leak's look: sleep `ns`, then the time. */
static uint64_t look_after(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
    return nvshare_now_ns();
}

/* How long this job's work ran on after a leak's window shut: one more measure (see above). */
static void note_over(struct nvshare_gpu *g, uint64_t over)
{
    uint64_t was = g->hold.leak_over_ns;
    g->hold.leak_over_ns = over >= was ? over : was - (was - over) / LEAK_OVER_DECAY;
}

/* A leak (see above), long kernels kept held with `keep_long`, its window shut by `shut_by` at the
 * latest (0: no such end); returns when the leaked segment had run (or was given up on). */
static uint64_t leak(struct nvshare_gpu *g, int keep_long, uint64_t shut_by)
{
    _Atomic(uint32_t) *passed = atomic_load(&g->hold.passed);
    if (!passed)
        return nvshare_now_ns();
    _Atomic(uint32_t) *arrived = passed - (HOLD_PASSED_OFFSET - HOLD_ARRIVED_OFFSET) / sizeof *passed;
    uint32_t before = atomic_load(passed);
    uint64_t now = nvshare_now_ns(), deadline = now + LEAK_OPEN_MAX_NS;
    int moved = 0;
    set_words(g, 0, keep_long);
    while (!(moved = atomic_load(passed) != before) && !atomic_load(&exiting) && now < deadline)
        now = look_after(LEAK_LOOK_NS);
    if (moved && nvshare_cfg.prompt_leak_open_ns) {   /* open: every segment passes, while the prompt job launches */
        uint64_t opened = now, shut = now + nvshare_cfg.prompt_leak_open_ns;
        if (shut_by && shut_by < shut)
            shut = shut_by;
        /* every 20 us: at 5 us the watcher used twice the CPU (fake driver, 40 requests) */
        while (now < shut && !atomic_load(&exiting) && !nvshare_burst_prompt_syncing(g))
            now = look_after(4 * LEAK_LOOK_NS);
        if (nvshare_cfg.debug)
            atomic_fetch_add_explicit(&counts[g - nvshare_gpus].open_us, (unsigned)((now - opened) / 1000),
                                      memory_order_relaxed);
    }
    set_word(g, 1);
    if (nvshare_cfg.debug) {
        atomic_fetch_add_explicit(&counts[g - nvshare_gpus].leaks[moved ? LEAK_PASSED : LEAK_NOTHING], 1,
                                  memory_order_relaxed);
        if (keep_long)
            atomic_fetch_add_explicit(&counts[g - nvshare_gpus].kept_long, 1, memory_order_relaxed);
    }
    if (!moved)
        return now;
    uint32_t mine = atomic_load(passed);   /* the segment after this wait runs until the next one */
    uint64_t set_at = now;                 /* the word set again: what runs from here on ran on */
    deadline = now + LEAK_SEGMENT_MAX_NS;
    int ran = 0;
    while (!(ran = (int32_t)(atomic_load(arrived) - mine) > 0) && !atomic_load(&exiting) && now < deadline)
        now = look_after(4 * LEAK_LOOK_NS);
    if (ran)   /* (not when nothing came after it: its end is not known) */
        note_over(g, now - set_at);
    return now;
}

/* A hold of `ns` in which leaks let `leaked_ns` of this job's work run counts that much less against
 * the yield budget, but at least half of it: a page that claims a prompt burst without end holds the
 * job at most the budget's worth still, or twice that with every other moment leaked. */
static uint64_t counted(uint64_t ns, uint64_t leaked_ns)
{
    return ns - (leaked_ns < ns / 2 ? leaked_ns : ns / 2);
}

static void *watch(void *arg)
{
    struct nvshare_gpu *g = arg;
    nvshare_in_hook = 1;
    pthread_setname_np(pthread_self(), "nvshare-hold");   /* top -H and the tests tell it apart */
    prctl(PR_SET_TIMERSLACK, 1000UL);   /* a leak's looks every 5 us, not the default 50 us later */
    uint64_t held_since = 0, gave_up = 0, window = 0, leak_began = 0, leak_next = 0, leaked = 0;
    uint64_t queued_began = 0;   /* the last queued prompt burst counted (debug) */
    unsigned looks = 0;
    int said[3] = {0, 0, 0}, said_flood = 0, held_corun = 0, held_expect = 0;
    for (;;) {
        uint64_t now = nvshare_now_ns();
        if (now - window >= HOLD_LOOKS_WINDOW_NS) {
            window = now;
            looks = 0;
        }
        if (++looks > HOLD_LOOKS_MAX) {
            if (!said_flood++)
                nvshare_debug("gpu %s: the burst page woke this job %u times in %.0f ms; it looks at it at "
                              "most every %.0f ms while that lasts", g->uuid, HOLD_LOOKS_MAX,
                              HOLD_LOOKS_WINDOW_NS / 1e6, HOLD_FLOOD_PAUSE_NS / 1e6);
            struct timespec ts = {0, (long)HOLD_FLOOD_PAUSE_NS};
            nanosleep(&ts, NULL);
            now = nvshare_now_ns();
        }
        if (atomic_load(&exiting) || atomic_load(&g->hold.state) == NVSHARE_HOLD_FAILED) {
            /* (FAILED: the driver refused a wait; launches wait on the host from now) */
            set_word(g, 0);
            return NULL;
        }
        struct nvshare_hold_ask a;
        uint64_t prompt_held = held_since && !held_corun ? now - held_since : 0;
        int hold = nvshare_burst_hold_now(g, now, counted(prompt_held, leaked), &a) && a.until != gave_up;
        if (hold && !a.corun && prompt_held >= NVSHARE_SERVE_HOLD_MAX_NS) {
            gave_up = a.until;   /* held as long as one burst may ask: not again for this one */
            hold = 0;
        }
        if (hold) {
            if (!held_since || a.corun != held_corun) {   /* a hold begins, or the other kind from now */
                if (!held_since)
                    set_word(g, 1);
                else if (!held_corun)
                    nvshare_burst_held(g, counted(now - held_since, leaked));
                leaked = 0;
                if (!a.corun && !a.expect)   /* held already as the prompt burst began: a lag of 0 */
                    count_lag(g, held_since ? a.began : nvshare_now_ns(), a.began);
                held_since = now;
                held_corun = a.corun;
                held_expect = 0;
                int kind = a.expect ? 2 : a.corun;
                if (!said[kind]++)
                    nvshare_debug("gpu %s: %s: this job's queued work is held on the GPU until it ends", g->uuid,
                                  a.expect ? "a co-runner's prompt burst is due soon"
                                  : a.corun ? "a co-runner's burst runs while prompt bursts are about"
                                            : "a co-runner's prompt burst runs");
            }
            if (a.expect && !held_expect) {   /* a hold ahead of an expected prompt burst: did it come? */
                held_expect = 1;
            } else if (held_expect && !a.expect && !a.corun) {
                held_expect = 0;
                if (nvshare_cfg.debug)
                    atomic_fetch_add_explicit(&counts[g - nvshare_gpus].expect[0], 1, memory_order_relaxed);
            }
            uint64_t cap = held_since + NVSHARE_SERVE_HOLD_MAX_NS;
            uint64_t end = a.end < cap ? a.end : cap;
            if (nvshare_cfg.debug && !a.corun && a.queued && a.began != queued_began) {
                queued_began = a.began;
                atomic_fetch_add_explicit(&counts[g - nvshare_gpus].queued[!a.leak_from], 1,
                                          memory_order_relaxed);
            }
            if (a.corun || !a.leak_from) {
                leak_began = leak_next = 0;
            } else if (a.began != leak_began || !leak_next) {   /* a prompt burst to leak into: from a period on */
                leak_began = a.began;
                leak_next = a.leak_from;
                /* Leaks that end in time go in from the burst's begin: a period later, what is left
                 * before a token's synchronise is due is less than a GEMM (see above). */
                if (nvshare_cfg.prompt_leak_fit && a.train && a.began && a.began < leak_next)
                    leak_next = a.began;
            }
            /* Leaks that end in time: by when what a leak lets pass has to end, 0: no such end. */
            uint64_t due = nvshare_cfg.prompt_leak_fit && a.train && a.began && a.span
                               ? a.began + a.span * LEAK_FIT_SHARE_PCT / 100 : 0;
            if (leak_next && now >= leak_next && due && now + g->hold.leak_over_ns >= due) {
                if (nvshare_cfg.debug)
                    atomic_fetch_add_explicit(&counts[g - nvshare_gpus].leaks[LEAK_LATE], 1, memory_order_relaxed);
                leak_next = UINT64_MAX;   /* none into this burst: the next one's begin sets it again */
            }
            if (leak_next && now >= leak_next) {
                uint64_t done = nvshare_now_ns();
                if (!nvshare_burst_prompt_syncing(g)) {
                    uint64_t from = done, long_ns = atomic_load(&g->hold.long_ns);
                    int keep_long = !nvshare_cfg.prompt_leak_long && !a.train && long_ns &&
                                    a.len < LEAK_LONG_FACTOR * long_ns;
                    done = leak(g, keep_long, due ? due - g->hold.leak_over_ns : 0);
                    leaked += done - from;
                }
                else if (nvshare_cfg.debug)
                    atomic_fetch_add_explicit(&counts[g - nvshare_gpus].leaks[LEAK_SYNCING], 1, memory_order_relaxed);
                leak_next = done + nvshare_cfg.prompt_leak_ns;
                continue;
            }
            if (leak_next && leak_next < end)
                end = leak_next;
            nvshare_burst_wait_prompts(g, a.seq, end > now ? end - now : 1000);
            continue;
        }
        leak_began = leak_next = 0;
        count_not_held(g, a.why);
        if (held_expect && nvshare_cfg.debug)   /* the window closed and the burst did not come */
            atomic_fetch_add_explicit(&counts[g - nvshare_gpus].expect[1], 1, memory_order_relaxed);
        held_expect = 0;
        if (held_since) {
            set_word(g, 0);
            if (!held_corun)
                nvshare_burst_held(g, counted(now - held_since, leaked));
            held_since = 0;
            leaked = 0;
        }
        if (a.page) {   /* until a prompt burst is expected, at the latest */
            uint64_t left = HOLD_LOOK_NS;
            if (a.look_by)
                left = a.look_by <= now ? 1000 : a.look_by - now < left ? a.look_by - now : left;
            nvshare_burst_wait_prompts(g, a.seq, left);
        } else {
            struct timespec ts = {0, (long)HOLD_NO_PAGE_NS};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

/* With setup_mu held: the word, mapped for the GPU, and its watcher; 0 when the driver cannot. */
/* _v2 from CUDA 11.7 on; before, the first one (which needs the driver's stream memory operations). */
static cuStreamWaitValue32_v2_fn wait_value(void)
{
    return nvshare_real.cuStreamWaitValue32_v2 ? nvshare_real.cuStreamWaitValue32_v2
                                               : (cuStreamWaitValue32_v2_fn)nvshare_real.cuStreamWaitValue32;
}

static cuStreamWaitValue32_v2_fn write_value(void)
{
    return nvshare_real.cuStreamWriteValue32_v2 ? (cuStreamWaitValue32_v2_fn)nvshare_real.cuStreamWriteValue32_v2
                                                : (cuStreamWaitValue32_v2_fn)nvshare_real.cuStreamWriteValue32;
}

static int make(struct nvshare_gpu *g)
{
    if (!wait_value() || !nvshare_real.cuMemHostRegister_v2 ||
        !nvshare_real.cuMemHostGetDevicePointer_v2)
        return 0;
    void *p = mmap(NULL, HOLD_WORD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    memset(p, 0, HOLD_WORD_BYTES);
    CUdeviceptr d = 0;
    nvshare_in_hook++;
    CUresult rc = nvshare_real.cuMemHostRegister_v2(p, HOLD_WORD_BYTES,
                                                    CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    int registered = rc == CUDA_SUCCESS;
    if (registered)
        rc = nvshare_real.cuMemHostGetDevicePointer_v2(&d, p, 0);
    int mapped = rc == CUDA_SUCCESS && d;
    if (registered && !mapped && nvshare_real.cuMemHostUnregister)
        nvshare_real.cuMemHostUnregister(p);   /* registered, but no address for the GPU: undone */
    nvshare_in_hook--;
    if (!mapped) {
        munmap(p, HOLD_WORD_BYTES);
        nvshare_debug("gpu %s: the driver maps no host word for the GPU (error %d): launches wait on the "
                      "host while co-runners' prompt bursts run", g->uuid, (int)rc);
        return 0;
    }
    g->hold.dword = d;
    g->hold.dlong = d + HOLD_LONG_OFFSET;
    if (nvshare_cfg.prompt_leak_ns && write_value()) {   /* before the word: the watcher sees both */
        g->hold.darrived = d + HOLD_ARRIVED_OFFSET;
        g->hold.dpassed = d + HOLD_PASSED_OFFSET;
        atomic_store(&g->hold.passed, (_Atomic(uint32_t) *)((char *)p + HOLD_PASSED_OFFSET));
    }
    atomic_store(&g->hold.word, (_Atomic(uint32_t) *)p);
    pthread_once(&exit_once, register_exit);
    if (nvshare_start_thread(watch, g, 128 * 1024) != 0)
        return 0;   /* the word stays, never written: waits on it would pass */
    return 1;
}

int nvshare_hold_ready(struct nvshare_gpu *g)
{
    int st = atomic_load_explicit(&g->hold.state, memory_order_acquire);
    if (st != NVSHARE_HOLD_UNTRIED)
        return st == NVSHARE_HOLD_READY;
    if (nvshare_cfg.prompt_hold != PROMPT_HOLD_GPU)
        return 0;
    pthread_mutex_lock(&setup_mu);
    if (atomic_load(&g->hold.state) == NVSHARE_HOLD_UNTRIED) {
        int ok = make(g);
        atomic_store_explicit(&g->hold.state, ok ? NVSHARE_HOLD_READY : NVSHARE_HOLD_FAILED, memory_order_release);
    }
    pthread_mutex_unlock(&setup_mu);
    return atomic_load(&g->hold.state) == NVSHARE_HOLD_READY;
}

/* The driver refused a write of a word in a stream: no leaks from now on (0). */
static int no_writes(struct nvshare_gpu *g)
{
    if (atomic_exchange(&g->hold.passed, NULL))
        nvshare_debug("gpu %s: the driver refused a write after a wait: its queue is held for whole prompt "
                      "bursts", g->uuid);
    return 0;
}

int nvshare_hold_wait(struct nvshare_gpu *g, CUstream stream, int long_kernel)
{
    nvshare_in_hook++;
    /* With leaks, the GPU says when it comes to the wait and when it is past it (see above). */
    int said = atomic_load_explicit(&g->hold.passed, memory_order_relaxed) != NULL;
    uint32_t n = said ? atomic_fetch_add_explicit(&g->hold.tickets, 1, memory_order_relaxed) + 1 : 0;
    if (said && write_value()(stream, g->hold.darrived, n, 0) != CUDA_SUCCESS)
        said = no_writes(g);
    CUresult rc = wait_value()(stream, long_kernel ? g->hold.dlong : g->hold.dword, 0, CU_STREAM_WAIT_VALUE_EQ);
    if (rc == CUDA_SUCCESS && said && write_value()(stream, g->hold.dpassed, n, 0) != CUDA_SUCCESS)
        no_writes(g);
    nvshare_in_hook--;
    if (rc == CUDA_SUCCESS)
        return 1;
    /* Refused (a driver without stream memory operations, a stream that takes none): host waits. */
    if (atomic_exchange(&g->hold.state, NVSHARE_HOLD_FAILED) == NVSHARE_HOLD_READY)
        nvshare_debug("gpu %s: the driver refused a wait on the GPU (error %d): launches wait on the host "
                      "while co-runners' prompt bursts run", g->uuid, (int)rc);
    return 0;
}

void nvshare_hold_after_fork(void)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n && i < NVSHARE_MAX_GPUS; i++) {
        /* The child has no watcher and no context of its parent's: tried again if it uses the GPU. */
        struct nvshare_hold_state *h = &nvshare_gpus[i].hold;
        atomic_store(&h->word, NULL);
        h->dword = 0;
        atomic_store(&h->passed, NULL);
        h->dpassed = h->darrived = h->dlong = 0;
        atomic_store(&h->long_ns, 0);
        h->leak_over_ns = 0;
        atomic_store(&h->tickets, 0);
        atomic_store(&h->state, NVSHARE_HOLD_UNTRIED);
    }
}
