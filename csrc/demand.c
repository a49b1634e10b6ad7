/* demand.c: what this process asks of each GPU, measured cheaply and reported to the daemon.
 *
 * The launch path only sets a flag (demand_touched, beside the gate's own `touched`). A sampler
 * thread looks every DEMAND_SAMPLE_NS: a GPU counts as busy in that sample when work entered its
 * gate, a thread is inside the gate (launching, or waiting in a synchronising call), or a thread
 * waits in cuCtxSynchronize, cuStreamSynchronize or cuEventSynchronize for its work (those are
 * interposed only to count that). A sample in which the process only waits for the lock counts
 * neither way: the figures describe the work as it runs, not the turns of others (counted as busy,
 * waiting made a 60 %-busy job in turns look ~100 % busy, so it kept taking turns that leave the GPU
 * idle in its pauses). From the samples: the busy share (an average over about DEMAND_WINDOW_NS),
 * and the mean lengths of busy stretches (bursts) and idle stretches between them (gaps), with
 * the time spent waiting left out of both, and how irregular the gaps are (their mean deviation over
 * their mean: requests arriving at random read ~0.7, a training's fixed pauses near 0). DEMAND goes to the
 * daemon when these moved enough, at most every DEMAND_REPORT_MIN_NS, and again every
 * DEMAND_REFRESH_NS (a restarted daemon has forgotten them). The daemon decides from them who takes
 * turns and who co-runs (docs/design-scheduler.md "Adaptive sharing").
 */
#include <time.h>

#include <pthread.h>
#include <string.h>

#include "burst.h"
#include "demand.h"
#include "driver.h"
#include "env.h"
#include "gate.h"
#include "gpus.h"
#include "outbox.h"

#define DEMAND_SAMPLE_NS 2000000ull            /* 2 ms */
#define DEMAND_OVERSLEPT_NS 4000000ull         /* a look this long after the last: overslept */
#define DEMAND_WINDOW_NS 1000000000ull         /* the busy share follows about the last second */
#define DEMAND_FIRST_REPORT_NS 40000000ull     /* first report once this much activity is seen */
#define DEMAND_REPORT_MIN_NS 250000000ull
#define DEMAND_REFRESH_NS 5000000000ull
#define DEMAND_BUSY_STEP 0.05                  /* report when the busy share moved this much */
#define DEMAND_LENGTH_STEP 0.25                /* or a mean burst or gap length this fraction */
#define DEMAND_SPREAD_STEP 0.2                 /* or the gaps' spread this much */

struct demand {
    int seen;                 /* sampled busy at least once */
    int busy_now;
    uint64_t run_start;       /* when the current busy or idle stretch began */
    uint64_t last_sample;
    uint64_t seen_ns;         /* time sampled since the first busy look, lock waits left out */
    double busy;              /* 0..1 */
    double burst_ns, gap_ns;  /* means; 0 = none finished yet */
    double gap_dev_ns;        /* mean deviation of a gap from the mean before it (irregular: a server) */
    unsigned bursts;          /* bursts finished (the mean's weight, for burst.c) */
    unsigned gaps;            /* gaps finished (the spread is known from NVSHARE_SPREAD_MIN_GAPS) */
    int reported;
    uint64_t reported_at;
    double sent_busy, sent_burst, sent_gap, sent_spread;
    int sent_spread_known;
};

static struct demand demands[NVSHARE_MAX_GPUS];
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;
static int started;

static int moved(double now, double before)
{
    if (before == 0)
        return now != 0;
    double change = now > before ? now - before : before - now;
    return change > DEMAND_LENGTH_STEP * before && change > 1e6;   /* and more than 1 ms */
}

static void report(struct nvshare_gpu *g, struct demand *d, uint64_t now)
{
    /* The stretch under way counts once it is longer than the mean: a job that never pauses
     * has one endless burst. */
    double run = (double)(now - d->run_start);
    double burst = d->busy_now && run > d->burst_ns ? run : d->burst_ns;
    double gap = !d->busy_now && run > d->gap_ns ? run : d->gap_ns;
    double spread = d->gap_ns > 0 ? d->gap_dev_ns / d->gap_ns : 0;
    double spread_step = spread > d->sent_spread ? spread - d->sent_spread : d->sent_spread - spread;
    if (d->reported) {
        uint64_t since = now - d->reported_at;
        if (since < DEMAND_REPORT_MIN_NS)
            return;
        double step = d->busy > d->sent_busy ? d->busy - d->sent_busy : d->sent_busy - d->busy;
        if (step < DEMAND_BUSY_STEP && !moved(burst, d->sent_burst) && !moved(gap, d->sent_gap)
            && spread_step < DEMAND_SPREAD_STEP && since < DEMAND_REFRESH_NS
            && d->sent_spread_known == (d->gaps >= NVSHARE_SPREAD_MIN_GAPS))
            return;
    } else if (d->seen_ns < DEMAND_FIRST_REPORT_NS) {
        return;
    }
    struct nvshare_demand msg;
    memset(&msg, 0, sizeof msg);
    nvshare_copy_str(msg.gpu_uuid, sizeof msg.gpu_uuid, g->uuid);
    msg.busy_ppm = (uint32_t)(d->busy * 1e6);
    msg.burst_us = burst / 1e3 > 4e9 ? 4000000000u : (uint32_t)(burst / 1e3);
    msg.gap_us = gap / 1e3 > 4e9 ? 4000000000u : (uint32_t)(gap / 1e3);
    msg.gap_spread_ppm = d->gaps < NVSHARE_SPREAD_MIN_GAPS ? NVSHARE_SPREAD_UNKNOWN
                         : spread > 4000 ? 4000000000u : (uint32_t)(spread * 1e6);
    if (nvshare_outbox_demand(&msg) == 0) {
        d->reported = 1;
        d->reported_at = now;
        d->sent_busy = d->busy;
        d->sent_burst = burst;
        d->sent_gap = gap;
        d->sent_spread = spread;
        d->sent_spread_known = d->gaps >= NVSHARE_SPREAD_MIN_GAPS;
    }
}

/* The stretch under way turns busy or idle at `at`: the one that ends there joins its mean. */
static void turn_to(struct demand *d, int busy, uint64_t at)
{
    if (busy == d->busy_now)
        return;
    if (at < d->run_start)
        at = d->run_start;
    double run = (double)(at - d->run_start);
    if (d->busy_now) {
        d->burst_ns = nvshare_run_mean(d->burst_ns, run);
        d->bursts++;
    } else {
        nvshare_gaps_add(&d->gap_ns, &d->gap_dev_ns, run);
        d->gaps++;
    }
    d->busy_now = busy;
    d->run_start = at;
}

/* How much of [from, now] was busy, for a sample the sampler overslept that saw work: the flag
 * says only that work entered some time in between. Counted whole, a loaded CPU made a 67 %-busy
 * job (8 ms kernels, 4 ms pauses) read 80 % and more: the sampler woke every 10 ms or so, nearly
 * every look had seen a launch, and the daemon took it for compute-bound (its partner co-ran
 * beside it and their kernels overlapped). The first synchronising call in and the last out note
 * the time (gate.h): busy from the later of `from` and the last one's start, to now when work is
 * in the gate or in a synchronise, else to the last one's end; launches with no synchronise in
 * between count one sample's time. The stretches turn where the work began and ended. */
static uint64_t overslept(struct nvshare_gpu *g, struct demand *d, uint64_t from, uint64_t now,
                          int active)
{
    uint64_t began = atomic_load_explicit(&g->gate.sync_began_ns, memory_order_relaxed);
    uint64_t ended = atomic_load_explicit(&g->gate.sync_ended_ns, memory_order_relaxed);
    uint64_t start = began > from && began < now ? began : from;
    uint64_t end = now;
    if (!active)
        end = ended > start && ended <= now ? ended
              : start + (now - start < DEMAND_SAMPLE_NS ? now - start : DEMAND_SAMPLE_NS);
    if (start > from)
        turn_to(d, 0, from);
    turn_to(d, 1, start);
    if (end < now)
        turn_to(d, 0, end);
    return end - start;
}

static void sample(struct nvshare_gpu *g, struct demand *d, uint64_t now)
{
    /* A burst under way with no first launch of it on its way into the gate (gate.h: announced, not
     * inside yet), read first and in this order: a burst begun after this look is not ended by it. */
    int burst_open = atomic_load(&g->burst.in_burst) && !atomic_load(&g->gate.beginning);
    int active = atomic_load_explicit(&g->gate.inside, memory_order_relaxed) > 0
                 || atomic_load_explicit(&g->gate.syncing, memory_order_relaxed) > 0;
    int busy = nvshare_gate_take_touched(g) || active;
    /* The real time since the last look: the sampler oversleeps on a loaded CPU. */
    uint64_t since = d->last_sample && now > d->last_sample ? now - d->last_sample : DEMAND_SAMPLE_NS;
    d->last_sample = now;
    if (!busy && (__atomic_load_n(&g->gate.waiters, __ATOMIC_RELAXED) > 0 ||
                  atomic_load_explicit(&g->burst.waiting, memory_order_relaxed) > 0)) {
        /* Only waiting for the lock or a co-runner's burst: the stretch under way is paused, not
         * lengthened. */
        if (d->seen)
            d->run_start = d->run_start + since < now ? d->run_start + since : now;
        return;
    }
    if (!d->seen) {
        if (!busy)
            return;
        d->seen = 1;
        d->busy_now = 1;
        d->run_start = now;
        d->seen_ns = DEMAND_SAMPLE_NS;   /* the first look counts as one sample, busy */
        d->busy = 1.0;
        return;
    }
    uint64_t busy_ns;
    if (busy && since > DEMAND_OVERSLEPT_NS) {
        busy_ns = overslept(g, d, now - since, now, active);
    } else {
        busy_ns = busy ? since : 0;
        turn_to(d, busy, now);
    }
    /* A time average over what was seen while that is shorter than the window, then a moving one.
     * Lock waits are left out here too: a job that waited most of its first 40 ms (its partner
     * held the GPU) reported a few samples as its demand (48 %-busy with 4 ms bursts, for a 67 %
     * job with 8 ms ones), and the daemon let it co-run as a light client. */
    d->seen_ns += since;
    double weight = (double)since / (double)d->seen_ns;
    if (weight < (double)since / DEMAND_WINDOW_NS)
        weight = (double)since / DEMAND_WINDOW_NS;
    if (weight > 1.0)
        weight = 1.0;
    d->busy += ((double)busy_ns / (double)since - d->busy) * weight;
    /* For the keeper: idle since at least the first idle sample of the stretch under way. */
    nvshare_gate_note_demand(g, d->busy_now ? 0 : d->run_start, (uint64_t)d->gap_ns, (unsigned)(d->busy * 1e6));
    struct nvshare_burst_demand note = {(uint64_t)d->burst_ns, (unsigned)(d->busy * 1e6), d->bursts,
                                        (uint64_t)d->gap_ns, (uint64_t)d->gap_dev_ns, d->gaps,
                                        d->busy_now ? 0 : d->run_start, d->seen_ns};
    nvshare_burst_note_demand(g, &note);
    /* Idle for a whole sample: a burst that no synchronise ended (a job that polls) is over. */
    int idle_sample = !busy || (!d->busy_now && now - d->run_start >= DEMAND_SAMPLE_NS);
    if (idle_sample && burst_open)
        nvshare_burst_end(g);
    if (nvshare_outbox_connected())
        report(g, d, now);
}

static void *sampler_main(void *arg)
{
    (void)arg;
    nvshare_in_hook = 1;
    struct timespec pause = {0, (long)DEMAND_SAMPLE_NS};
    for (;;) {
        nanosleep(&pause, NULL);
        uint64_t now = nvshare_now_ns();
        int n = atomic_load(&nvshare_n_gpus);
        for (int i = 0; i < n && i < NVSHARE_MAX_GPUS; i++) {
            struct nvshare_gpu *g = &nvshare_gpus[i];
            if (atomic_load_explicit(&g->mode, memory_order_relaxed) == GPU_GATED)
                sample(g, &demands[i], now);
        }
    }
    return NULL;
}

void nvshare_demand_start(void)
{
    pthread_mutex_lock(&start_mu);
    if (!started) {
        started = 1;
        if (nvshare_start_thread(sampler_main, NULL, 64 * 1024) != 0)
            nvshare_log("cannot start the demand sampler; the scheduler treats this process as busy");
    }
    pthread_mutex_unlock(&start_mu);
}

/* The child has no sampler thread and has asked for nothing yet. */
void nvshare_demand_after_fork(void)
{
    pthread_mutex_init(&start_mu, NULL);
    started = 0;
    memset(demands, 0, sizeof demands);
}
