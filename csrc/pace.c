/* pace.c: a job that yields to co-runners' prompt bursts keeps little of its work queued on the GPU.
 *
 * Yielding (burst.c) stops a job launching while a co-runner's prompt burst (a request served, a
 * command at a prompt) runs, but what the job had queued before still runs beside that burst. A
 * training queues a whole step at once (20 ms of kernels in bench_mixes' serve2): on the H100, 3 ms
 * requests beside it took 14.6 ms at p99 with yielding alone, against 6.3 ms alone. So while
 * co-runners' prompt bursts are about (one seen in the last second, PROMPTS_ABOUT_NS:
 * nvshare_burst_prompts_about), a launch first waits until this job's work still queued is under a
 * cap, and a request then shares the GPU with at most that much. The cap follows the prompt bursts' length (issue 42): a tenth of the
 * mean burst the last prompt job wrote on the page, at least PACE_CAP_MIN_NS and at most
 * PACE_CAP_MAX_NS; a request then waits for a tenth of its own length at most, and a training
 * beside a server of long requests (a generate of 40 ms) keeps a deeper queue. The page is not
 * trusted: a job that writes a long length there makes the others' queues at most 4 ms deep. With
 * NVSHARE_PROMPT_QUEUE_MS set the cap is that, fixed (before issue 42: 1 ms for every request).
 *
 * How much is queued: an event is recorded after a launch once the launches since the last event
 * add up to a quarter of the cap (every launch while their length is unknown; held on the GPU,
 * below, HOLD_MARK_NS). The events not yet done, times the launches each marks, times the GPU time
 * of one launch, is the queue. That time is measured, not guessed: between two events of one stream
 * where the later was recorded while the earlier was still queued, and with no hold of the queue
 * between them (hold.c counts them), the GPU ran the later's launches back to back (a running mean).
 *
 * The turn holder counts the launch that runs too: a request then waits for the least. A co-runner
 * (a bursty job) counts only what waits behind it: with kernels as long as the cap it would
 * otherwise run them one at a time, and the hardware's time-slicing passes a context with nothing
 * queued over for the others' turn: on the H200 a bursty job of 1 ms kernels beside a training and
 * a probe ran 1.58x its time alone that way (1.47x counting only what waits; co-location 1.46x).
 * A wait spins on the oldest event (sched_yield between looks) for its first PACE_SPIN_NS, then
 * polls every PACE_POLL_NS: a sleeping wait woke ~0.1 ms late, the GPU idle meanwhile. It never
 * lasts longer than PACE_WAIT_MAX_NS: work queued behind something that waits for a later launch
 * would otherwise never be done, and pacing then stops for PACE_OFF_NS. The caller records nothing
 * while a graph capture is open on the GPU (the event would become part of the graph). A co-runner
 * that claims prompt bursts without end makes this job pace all the time, which costs it no GPU
 * time, only the queue's depth.
 *
 * By default, where the driver takes waits on a host word, none of that waits on the host: the job
 * keeps its whole queue, and the GPU holds it while a prompt burst runs (hold.c). A launch then only
 * puts a wait for hold.c's word into its stream first, once the launches since the last wait add
 * up to a segment (a quarter of the cap, 0.2 to 0.5 ms; every launch while their length is
 * unknown); the events above still tell a launch's length. A segment counts launches of their mean
 * length, and a training's few long kernels hide among many short ones (fp32 GEMMs of 1.0-1.4 ms
 * among elementwise kernels: a mean of 0.04-0.06 ms on the H200), so two of them could run in one
 * segment. So the length of each launch shape (a kernel at one grid and block, a graph) is learned
 * from events around it, and one that runs a segment or longer gets a wait before and after it
 * (NVSHARE_HOLD_SHAPES=off: the mean only). NVSHARE_PROMPT_HOLD=host, or a driver that refuses the
 * waits, keeps the host-side waits.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>
#include <time.h>

#include "burst.h"
#include "driver.h"
#include "env.h"
#include "gpus.h"
#include "hold.h"
#include "pace.h"

#define PACE_MARK_PARTS 4                 /* an event per quarter of the cap's worth of launches */
#define PACE_SPIN_NS 1000000ull           /* a wait spins this long (a training's kernel or two) ... */
#define PACE_POLL_NS 20000ull             /* ... then looks at the oldest event again after this */
#define PACE_WAIT_MAX_NS 100000000ull     /* 100 ms: then launch anyway ... */
#define PACE_OFF_NS 1000000000ull         /* ... and stop pacing for a second */
#define PACE_MEAN_WEIGHT 8                /* a new measurement counts 1/8 in the running mean */
#define PACE_LEN_PARTS 10                 /* the cap: a tenth of the prompt bursts' mean length ... */
#define PACE_CAP_MIN_NS 250000ull         /* ... at least 0.25 ms (an interactive command's 1 ms) ... */
#define PACE_CAP_MAX_NS 4000000ull        /* ... at most 4 ms */
/* Held on the GPU (hold.c): a wait before the launch that follows a segment's worth of launches, a
 * quarter of the cap, 0.2 to 0.5 ms (the GPU passes a wait in about 2 us: 1 % of 0.2 ms). */
#define HOLD_SEG_PARTS 4
#define HOLD_SEG_MIN_NS 200000ull
#define HOLD_SEG_MAX_NS 500000ull
/* Held, the events only teach a launch's length and its shape's (nothing waits for the queue to
 * shorten): one marks at least HOLD_MARK_NS of launches, and what is done is looked at once every
 * HOLD_LOOK_NS at most. At the host wait's quarter of a 0.25 ms cap, a bf16 training's launches of
 * 0.05-0.07 ms each got an event and a query apiece. */
#define HOLD_MARK_NS 1000000ull
#define HOLD_LOOK_NS 500000ull
#define SHAPES_SAID_MAX 8                 /* the debug log names this many long shapes */
/* Co-runners' prompt bursts are "about" for a second after one was seen (the queue kept short
 * meanwhile): requests at a few per second still find every launch paced. Held on the GPU, for as
 * long as the job yields (UINT64_MAX): waits cost it about 1 % and no queue depth, and the daemon
 * says YIELD while a co-runner with bursts holds or a prompt client that holds nothing is
 * registered (policy/corunners.py). Then a command typed now and then (issue 42's interactive
 * step), or a server's first request after its warm-up, finds the queue in segments the GPU can
 * hold; with a window of ten seconds from the last prompt burst seen, serve2's first request on
 * the H200 ran beside the training's whole unwaited step. */
#define PROMPTS_ABOUT_NS 1000000000ull
#define PROMPTS_ABOUT_HELD_NS UINT64_MAX

/* The queue cap now (see the header). */
static uint64_t queue_cap(struct nvshare_gpu *g)
{
    if (nvshare_cfg.prompt_queue_fixed)
        return nvshare_cfg.prompt_queue_ns;
    uint64_t follow = nvshare_burst_prompt_len(g) / PACE_LEN_PARTS;
    follow = follow < PACE_CAP_MAX_NS ? follow : PACE_CAP_MAX_NS;
    return follow > PACE_CAP_MIN_NS ? follow : PACE_CAP_MIN_NS;
}

/* Held on the GPU: the GPU work between two waits. */
static uint64_t hold_segment(uint64_t cap)
{
    uint64_t seg = cap / HOLD_SEG_PARTS;
    return seg < HOLD_SEG_MIN_NS ? HOLD_SEG_MIN_NS : seg > HOLD_SEG_MAX_NS ? HOLD_SEG_MAX_NS : seg;
}

static unsigned slot_at(const struct nvshare_pace_state *p, unsigned i) { return (p->head + i) % NVSHARE_PACE_RING; }

/* A running mean with x in it (x itself while there is none). */
static uint64_t mean_with(uint64_t mean, uint64_t x)
{
    return mean ? (mean * (PACE_MEAN_WEIGHT - 1) + x) / PACE_MEAN_WEIGHT : x;
}

/* The table's entry of a shape, or NULL; with `make`, the entry it gets (the other way of its set
 * is kept: the one looked at or measured last). */
static struct nvshare_pace_shape *shape_entry(struct nvshare_pace_state *p, uintptr_t key, int make)
{
    uint64_t h = (uint64_t)key * 0x9e3779b97f4a7c15ull;
    unsigned i = (unsigned)(h >> 40) % (NVSHARE_PACE_SHAPES / 2) * 2;
    struct nvshare_pace_shape *a = &p->shapes[i], *b = &p->shapes[i + 1];
    if (a->key == key || b->key == key) {
        struct nvshare_pace_shape *hit = a->key == key ? a : b;
        if (hit == b) {   /* the way looked at last goes first: the other is the next to go */
            struct nvshare_pace_shape t = *a;
            *a = *b;
            *b = t;
        }
        return a;
    }
    if (!make)
        return NULL;
    *b = *a;
    a->key = key;
    a->ns = 0;
    return a;
}

/* Measured alone: one launch of `key` took ns on the GPU. */
static void shape_measured(struct nvshare_gpu *g, struct nvshare_pace_state *p, uintptr_t key, uint64_t ns)
{
    struct nvshare_pace_shape *e = shape_entry(p, key, 1);
    uint64_t seg = hold_segment(p->cap);
    if (e->ns < seg && ns >= seg && p->shapes_said < SHAPES_SAID_MAX) {
        p->shapes_said++;
        nvshare_debug("a launch shape runs %.2f ms on the GPU, a segment %.2f ms: held, a wait goes before "
                      "and after each of its launches%s", ns / 1e6, seg / 1e6,
                      p->shapes_said == SHAPES_SAID_MAX ? " (said of no more shapes)" : "");
    }
    e->ns = ns > e->ns ? ns : mean_with(e->ns, ns);
    if (e->ns >= seg)
        nvshare_hold_long_kernel(g, e->ns);
}

/* The GPU time of the launches not seen done yet (marked by events, and those since); for a
 * co-runner, less the one that runs. With the length of a launch unknown, each counts half the cap. */
static uint64_t queued_ns(const struct nvshare_pace_state *p, int corunner, uint64_t cap)
{
    uint64_t launches = p->unmarked;
    for (unsigned i = 0; i < p->n; i++)
        launches += p->ring[slot_at(p, i)].launches;
    if (corunner && launches)
        launches--;
    uint64_t each = p->launch_ns ? p->launch_ns : cap / 2;
    return launches * each;
}

/* With mu held: forget the events found done, learning a launch's length from them: from two
 * back to back in one stream with no hold between them (a segment's wait that held the queue for a
 * 60 ms request made a 2 ms kernel read 61 ms on the fake driver). */
static void forget_done(struct nvshare_gpu *g, struct nvshare_pace_state *p)
{
    while (p->n) {
        unsigned i = p->head;
        struct nvshare_pace_slot *s = &p->ring[i];
        CUresult rc = nvshare_real.cuEventQuery(s->ev);
        if (rc == CUDA_ERROR_NOT_READY)
            return;
        int prev = p->last_done;   /* the slot before this one, its event still as recorded? */
        if (rc == CUDA_SUCCESS && s->behind && s->launches &&
            prev == (int)((i + NVSHARE_PACE_RING - 1) % NVSHARE_PACE_RING) &&
            !p->ring[prev].held && p->ring[prev].holds == s->holds && nvshare_hold_count(g) == s->holds) {
            float ms = 0;
            if (nvshare_real.cuEventElapsedTime(&ms, p->ring[prev].ev, s->ev) == CUDA_SUCCESS && ms > 0) {
                uint64_t each = (uint64_t)(ms * 1e6) / s->launches;
                p->launch_ns = mean_with(p->launch_ns, each);
                if (s->shape && s->launches == 1)
                    shape_measured(g, p, s->shape, each);
            }
        }
        if (rc != CUDA_SUCCESS)
            s->ev = NULL;   /* its context is gone (or the driver refused it): made again when needed */
        p->last_done = rc == CUDA_SUCCESS ? (int)i : -1;
        p->head = (i + 1) % NVSHARE_PACE_RING;
        p->n--;
    }
}

int nvshare_pace_wait(struct nvshare_gpu *g)
{
    uint64_t now = 0;
    int st = atomic_load_explicit(&g->hold.state, memory_order_relaxed);
    int held_here = st == NVSHARE_HOLD_READY ||
                    (st == NVSHARE_HOLD_UNTRIED && nvshare_cfg.prompt_hold == PROMPT_HOLD_GPU);
    uint64_t about = held_here ? PROMPTS_ABOUT_HELD_NS : PROMPTS_ABOUT_NS;
    if (!nvshare_real.cuEventRecord || !nvshare_real.cuEventQuery || !nvshare_real.cuEventElapsedTime ||
        !nvshare_real.cuEventCreate)
        return 0;
    /* A prompt job ahead of a much shorter one's expected burst: held on the GPU or not at all. */
    int shorter = 0;
    if (!nvshare_burst_prompts_about(g, &now, about) &&
        (!held_here || !(shorter = nvshare_burst_shorter_due(g, &now))))
        return 0;
    struct nvshare_pace_state *p = &g->pace;
    uint64_t cap = queue_cap(g);
    if (pthread_mutex_trylock(&p->mu) != 0) {
        pthread_mutex_lock(&p->mu);
        now = nvshare_now_ns();   /* waited for another thread's pacing: the clock moved on */
    }
    if (now < p->off_until) {
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    int held = nvshare_hold_ready(g);
    if (shorter && !held) {
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    if (now - p->paced_ns > PACE_OFF_NS || cap > p->cap_said + p->cap_said / 4 ||
        cap < p->cap_said - p->cap_said / 4) {
        if (held)
            nvshare_debug("gpu %s: co-runners' prompt bursts are about: its queued work is held on the GPU "
                          "while one runs (a wait every %.2f ms of work, a launch %.2f ms)", g->uuid,
                          hold_segment(cap) / 1e6, p->launch_ns / 1e6);
        else
            nvshare_debug("gpu %s: co-runners' prompt bursts are about: at most %.1f ms of work queued (a "
                          "launch %.2f ms)", g->uuid, cap / 1e6, p->launch_ns / 1e6);
        p->cap_said = cap;
    }
    p->paced_ns = now;
    p->cap = cap;
    nvshare_in_hook++;
    if (held) {
        if (p->n && now - p->looked_ns >= HOLD_LOOK_NS) {
            p->looked_ns = now;
            forget_done(g, p);   /* what is done tells a launch's length; nothing is waited for here */
        }
        nvshare_in_hook--;
        pthread_mutex_unlock(&p->mu);
        return NVSHARE_PACE_HOLD;
    }
    uint64_t deadline = now + PACE_WAIT_MAX_NS, spin_until = now + PACE_SPIN_NS;
    int corunner = atomic_load_explicit(&g->burst.armed, memory_order_relaxed);
    for (;;) {
        forget_done(g, p);
        if (!p->n || queued_ns(p, corunner, cap) < cap)
            break;
        uint64_t t = nvshare_now_ns();
        if (t < spin_until) {
            sched_yield();
            continue;
        }
        if (t >= deadline) {
            p->off_until = t + PACE_OFF_NS;
            nvshare_debug("gpu %s: queued work not done after %.0f ms (behind another stream?); not pacing "
                          "launches for %.0f s", g->uuid, PACE_WAIT_MAX_NS / 1e6, PACE_OFF_NS / 1e9);
            break;
        }
        struct timespec ts = {0, (long)PACE_POLL_NS};
        nanosleep(&ts, NULL);
    }
    nvshare_in_hook--;
    pthread_mutex_unlock(&p->mu);
    return NVSHARE_PACE_HOST;
}

/* With mu held: the events were made in another context; forget them once none is pending. */
static int same_context(struct nvshare_pace_state *p)
{
    CUcontext ctx = NULL;
    if (nvshare_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return 0;
    if (ctx == p->ctx)
        return 1;
    if (p->n || p->unmarked)
        return 0;   /* a launch in another context than the paced ones: not paced */
    for (int i = 0; i < NVSHARE_PACE_RING; i++) {
        if (p->ring[i].ev && nvshare_real.cuEventDestroy_v2)
            nvshare_real.cuEventDestroy_v2(p->ring[i].ev);
        p->ring[i].ev = NULL;
    }
    p->ctx = ctx;
    p->last_done = -1;
    return 1;
}

/* With mu held, in the paced context: an event after the launches not marked yet, the last of
 * them alone of `shape` (0: several, or not to be measured). */
static void mark(struct nvshare_gpu *g, struct nvshare_pace_state *p, CUstream stream, uintptr_t shape)
{
    if (p->n == NVSHARE_PACE_RING)
        return;   /* every slot waits (only with more threads than the cap lets through) */
    unsigned i = slot_at(p, p->n);
    struct nvshare_pace_slot *s = &p->ring[i];
    if (!s->ev && nvshare_real.cuEventCreate(&s->ev, 0) != CUDA_SUCCESS) {
        s->ev = NULL;
        return;
    }
    if ((int)i == p->last_done)
        p->last_done = -1;   /* its event is recorded again */
    if (nvshare_real.cuEventRecord(s->ev, stream) != CUDA_SUCCESS)
        return;
    struct nvshare_pace_slot *before = p->n ? &p->ring[slot_at(p, p->n - 1)] : NULL;
    s->stream = stream;
    s->launches = p->unmarked;
    /* Still queued when this one is recorded: the GPU runs the launches between them back to back.
     * Otherwise their elapsed time holds the host's gap too (a 20 us kernel read 0.68 ms on the fake
     * driver behind an idle stream). */
    s->behind = before && before->stream == stream &&
                nvshare_real.cuEventQuery(before->ev) == CUDA_ERROR_NOT_READY;
    s->shape = shape;
    s->holds = nvshare_hold_count(g);
    s->held = nvshare_hold_on(g);
    p->unmarked = 0;
    p->n++;
}

/* Held: this thread's launch between nvshare_pace_hold() and nvshare_pace_launched(), its shape and
 * how it is to be measured and waited around (host waits: none, a short one). */
enum { SHAPE_SHORT = 0, SHAPE_UNKNOWN = 1, SHAPE_LONG = 2 };
static __thread struct { uintptr_t shape; int kind, held; } launch_tl;

/* A segment holds launches of their mean length; a launch of a shape that ran a segment or longer
 * (a GEMM among elementwise kernels) gets a wait before it and one after: a prompt burst then waits
 * for that one kernel at most, where two of them could run in one segment (on the H200 an
 * interactive step beside an fp32 training's 1.4 ms GEMMs waited up to 3.7 ms more than alone). A
 * shape not measured yet, or a long one, is measured alone (an event before it and after it). */
void nvshare_pace_hold(struct nvshare_gpu *g, CUstream stream, uintptr_t shape)
{
    struct nvshare_pace_state *p = &g->pace;
    pthread_mutex_lock(&p->mu);
    uint64_t each = p->launch_ns, seg = hold_segment(p->cap);
    shape = nvshare_cfg.hold_shapes ? shape : 0;
    struct nvshare_pace_shape *e = shape ? shape_entry(p, shape, 0) : NULL;
    int kind = !shape ? SHAPE_SHORT : !e || !e->ns ? SHAPE_UNKNOWN : e->ns >= seg ? SHAPE_LONG : SHAPE_SHORT;
    launch_tl.shape = shape;
    launch_tl.kind = kind;
    launch_tl.held = 1;
    int waited = 0;
    if (!each || kind == SHAPE_LONG || p->after_long || (uint64_t)p->unwaited * each >= seg) {
        if (nvshare_hold_wait(g, stream, kind == SHAPE_LONG)) {
            p->unwaited = 0;
            waited = 1;
        }
    }
    p->after_long = kind == SHAPE_LONG;
    /* It is measured alone: an event after the launches before it, and after the wait just put in
     * (one after the launch before, a long one, would measure the wait too: on the fake driver,
     * whose waits pass when a polling thread next looks, a 20 us kernel read up to 2 ms so). */
    if (kind != SHAPE_SHORT && (p->unmarked || waited)) {
        nvshare_in_hook++;
        if (same_context(p))
            mark(g, p, stream, 0);
        nvshare_in_hook--;
    }
    pthread_mutex_unlock(&p->mu);
}

void nvshare_pace_launched(struct nvshare_gpu *g, CUstream stream)
{
    struct nvshare_pace_state *p = &g->pace;
    uintptr_t shape = launch_tl.shape;
    int kind = launch_tl.kind, held = launch_tl.held;
    launch_tl.shape = 0;
    launch_tl.kind = SHAPE_SHORT;
    launch_tl.held = 0;
    pthread_mutex_lock(&p->mu);
    nvshare_in_hook++;
    p->unwaited++;
    if (!same_context(p))
        goto out;
    p->unmarked++;
    uint64_t each = p->launch_ns, every = held ? HOLD_MARK_NS : p->cap / PACE_MARK_PARTS;
    if (kind == SHAPE_SHORT && each && p->unmarked * each < every)
        goto out;   /* short launches: one event marks several */
    mark(g, p, stream, kind != SHAPE_SHORT && p->unmarked == 1 ? shape : 0);
out:
    nvshare_in_hook--;
    pthread_mutex_unlock(&p->mu);
}

/* A copy or set into a stream (issue 42): a PyTorch training begins each step with a copy of its
 * batch to the GPU and ends it with a copy of its loss back (.item()). Waiting on the host while a
 * prompt burst ran, as every call that enters the gate does (burst.c's yield point), its host stood
 * through a whole request with nothing queued, its GPU idle and leaks finding nothing waiting (on the
 * H200 beside model.generate: 3.2 s of such waits in a 20 s window, 1423 leaks that found nothing),
 * and those waits counted against the yield budget beside the hold of the same moments. Held on the
 * GPU like a launch, the copy goes behind a wait of its own (its length is not known: it is no part
 * of a segment), and what follows it queues behind it. A copy from or to pageable memory still
 * returns only once done, as without the hook: leaks let it run. Only while the prompt job's bursts
 * come in trains (NVSHARE_HOLD_COPIES=trains, the default; the page's prompt_train): beside a batch-1
 * CNN's single 3 ms requests the host wait is short, and it spares the request the leaks of the
 * training's next step: held at once (`always`) the CNN's median service read 0.03-0.38 ms more in
 * three runs on the H200, its p99 1.13-1.30x alone against 0.95-1.16x, the training the same. */
int nvshare_pace_copy_held(struct nvshare_gpu *g)
{
    uint64_t now = 0;
    return nvshare_cfg.hold_copies &&
           (nvshare_cfg.hold_copies == HOLD_COPIES_ALWAYS || nvshare_burst_prompt_train(g)) &&
           nvshare_burst_prompts_about(g, &now, PROMPTS_ABOUT_HELD_NS) && nvshare_hold_ready(g);
}

void nvshare_pace_hold_copy(struct nvshare_gpu *g, CUstream stream)
{
    struct nvshare_pace_state *p = &g->pace;
    pthread_mutex_lock(&p->mu);
    if (nvshare_hold_wait(g, stream, 0)) {
        p->unwaited = 0;
        p->after_long = 0;
    }
    pthread_mutex_unlock(&p->mu);
}

void nvshare_pace_after_fork(void)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n && i < NVSHARE_MAX_GPUS; i++) {
        /* The child has no context of its parent's: its events are not its own. */
        struct nvshare_pace_state *p = &nvshare_gpus[i].pace;
        memset(p, 0, sizeof *p);
        pthread_mutex_init(&p->mu, NULL);
        p->last_done = -1;
    }
}
