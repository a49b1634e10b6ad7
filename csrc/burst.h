/* burst.h: co-running jobs on one GPU take turns burst by burst, through a page they share
 * (burst.c). Owns `struct nvshare_burst_state` of each GPU's record. Calls only gpus.c's record and
 * env.c.
 */
#ifndef NVSHARE_BURST_H
#define NVSHARE_BURST_H

#include <stdatomic.h>
#include <stdint.h>

#include "driver.h"
#include "gpus.h"

#define NVSHARE_EXPECT_SLOTS 4
/* One page per GPU, shared by the jobs co-running on it; nothing in it is trusted. */
struct nvshare_burst_page {
    _Atomic uint32_t owner;       /* the token of the job whose burst runs, 0: none */
    _Atomic uint32_t seq;         /* futex word: bumped at every burst's end */
    _Atomic uint32_t waiters;     /* a hint: jobs waiting on seq */
    _Atomic uint32_t prompt_early;  /* 1: the prompt burst under way is a job's early one, its class not
                                       known yet (burst.c, early_hold): a prompt job does not wait for it */
    _Atomic uint64_t prompt_until;  /* a prompt burst (a request, a command) runs until about this
                                       CLOCK_MONOTONIC time: the others launch nothing new; 0: none */
    _Atomic uint32_t prompt_seq;    /* futex word: bumped when a prompt burst ends */
    _Atomic uint32_t prompt_waiters;  /* a hint: jobs waiting on prompt_seq */
    _Atomic uint64_t prompt_len_ns;   /* the mean length of the last prompt burst's job's bursts (the
                                         others' queue cap follows it: pace.c) */
    _Atomic uint64_t prompt_began_ns;  /* when the last prompt burst began (or one that may be: a
                                          provisional one), CLOCK_MONOTONIC: prompt bursts are about;
                                          one that began beside another and should end sooner (a
                                          cut-in, burst.c's cuts_in) leaves it, and prompt_span_ns */
    _Atomic uint64_t prompt_next_until;  /* a prompt job waits for another's prompt burst and runs its
                                            own at the latest by this time: the others stay held */
    _Atomic uint32_t prompt_syncing;  /* prompt jobs whose burst waits in a synchronise now (a hint): its
                                         launches are in, what is left is GPU work (hold.c's leaks wait) */
    _Atomic uint32_t prompt_train;    /* 1: the last prompt burst's job's bursts come in trains (a request
                                         of many: model.generate's tokens), 0: one burst a request */
    _Atomic uint32_t prompt_queued;   /* 1: the last prompt burst began right after its job's burst before
                                         ended (a request that waited for the one before it) */
    _Atomic uint64_t prompt_span_ns;  /* the mean span of the last prompt burst's job's prompt bursts, from
                                         begin to end as burst.c announced them (a token of model.generate:
                                         demand.c's bursts may hold a whole request), 0: none yet */
    /* Prompt bursts that come on time (burst.c's expectations, NVSHARE_PROMPT_EXPECT): a job whose gaps
     * between prompt bursts hardly vary (a command every second, a probe every 100 ms) says when its
     * next one should begin, and the others hold their queues on the GPU from a little before, so
     * that it meets no kernel under way. One slot per such job, NVSHARE_EXPECT_SLOTS at most. */
    struct nvshare_burst_expect {
        _Atomic uint64_t at;       /* the next prompt burst should begin about then (CLOCK_MONOTONIC), 0: free */
        _Atomic uint32_t dev_us;   /* ... give or take this (the gaps' mean deviation, microseconds) */
        _Atomic uint32_t token;    /* whose slot it is (burst.c's token of that process) */
    } expect[NVSHARE_EXPECT_SLOTS];
    /* The mean span of each slot's job's prompt bursts (microseconds, 0: not said): a prompt job holds
     * its own queue ahead of a much shorter one's expected burst (NVSHARE_PROMPT_SHORTER, burst.c). */
    _Atomic uint32_t expect_span_us[NVSHARE_EXPECT_SLOTS];
};
/* The page the daemon passed (BURST_PAGE); takes fd. 0 when mapped, -1 when refused. */
int nvshare_burst_attach(struct nvshare_gpu *g, int fd);
/* A grant's part: bursts take turns from now on (a shared grant, BURSTS), and this job waits out
 * the prompt bursts of co-runners (BURSTS or YIELD), when the page has come; off: neither. */
void nvshare_burst_arm(struct nvshare_gpu *g, int bursts, int yields);
void nvshare_burst_begin(struct nvshare_gpu *g);
void nvshare_burst_end(struct nvshare_gpu *g);
/* demand.c's running means (bursts, gaps, the gaps' deviation): the newest counts this much. */
#define NVSHARE_RUN_WEIGHT 0.25
/* The gaps' spread is known from this many gaps on (one deviation); before, DEMAND says it is not
 * known: a server's first gap (after its warm-up) is one wait, and a job with that one gap read as
 * a bursty training (long burst, long gap, no spread) and took turns (issue 42). */
#define NVSHARE_SPREAD_MIN_GAPS 2
static inline double nvshare_run_mean(double mean, double value)
{
    return mean == 0 ? value : mean + NVSHARE_RUN_WEIGHT * (value - mean);
}
/* One gap more in the running means of the gaps and of their deviation (each gap's from the mean
 * before it): demand.c's for each gap that ends, burst.c's for the one that ends as a burst begins. */
static inline void nvshare_gaps_add(double *mean, double *dev, double gap)
{
    if (*mean != 0)
        *dev = nvshare_run_mean(*dev, gap > *mean ? gap - *mean : *mean - gap);
    *mean = nvshare_run_mean(*mean, gap);
}

/* What demand.c measured of this process on g: how long to wait for others, and whether its own
 * bursts are prompt. */
struct nvshare_burst_demand {
    uint64_t burst_ns;        /* the mean burst */
    unsigned busy_ppm;        /* the busy share */
    unsigned bursts;          /* how many bursts the mean is of */
    uint64_t gap_ns;          /* the mean gap between bursts */
    uint64_t gap_dev_ns;      /* the gaps' mean deviation from the mean before each */
    unsigned gaps;            /* how many gaps those are of */
    uint64_t idle_since;      /* idle since then (0: busy now) */
    uint64_t seen_ns;         /* how long its work has been sampled (lock waits left out) */
};
void nvshare_burst_note_demand(struct nvshare_gpu *g, const struct nvshare_burst_demand *d);
/* A synchronise of this process on g begins (on: 1), or its last one ends (0): while its burst
 * is a prompt one, the page counts it (prompt_syncing). */
void nvshare_burst_syncing(struct nvshare_gpu *g, int on);
/* Does a prompt job's burst wait in a synchronise now (the page says so; untrusted)? */
int nvshare_burst_prompt_syncing(struct nvshare_gpu *g);
/* The length the last prompt burst's job announced for its bursts (0: none; untrusted). */
uint64_t nvshare_burst_prompt_len(struct nvshare_gpu *g);
/* Do the last prompt burst's job's bursts come in trains (the page's prompt_train; untrusted)? */
int nvshare_burst_prompt_train(struct nvshare_gpu *g);
void nvshare_burst_after_fork(void);

/* Does this job yield to co-runners' prompt bursts, with one seen in the last `window_ns`, while
 * its own bursts are not prompt? pace.c then keeps its queued work short (or held). *now_out: the
 * clock it read, once past the cheap looks (then 1 or 0 by the page's word). */
int nvshare_burst_prompts_about(struct nvshare_gpu *g, uint64_t *now_out, uint64_t window_ns);
/* NVSHARE_PROMPT_SHORTER: is this job's bursts prompt, and a much shorter prompt job's next burst
 * expected (burst.c's expectations)? pace.c then puts waits in its queue, held on the GPU only. */
int nvshare_burst_shorter_due(struct nvshare_gpu *g, uint64_t *now_out);

/* A wait for one prompt burst lasts at most this long (a server's longest hold). */
#define NVSHARE_SERVE_HOLD_MAX_NS 200000000ull

/* hold.c's watcher: should this job's queued work be held on the GPU now, at `now`, with `held_ns`
 * of a hold under way? 1 when so, until a->end (the prompt burst's end or the yield budget's);
 * a->seq: the page's prompt_seq as read (wait on it), a->until: the burst's announced end, a->page:
 * a page has come. */
struct nvshare_hold_ask {
    int page;
    int corun;         /* the hold is for a co-runner's ordinary burst (burst.c's corun_hold), not a prompt one */
    uint32_t seq;
    uint64_t until, end;
    uint64_t began;    /* when the prompt burst under way began, as the page says (debug counts) */
    uint64_t leak_from; /* a prompt hold that may let one segment of this job's work pass at a time from
                           then on (hold.c's leaks), 0: none may */
    uint64_t len;      /* the prompt job's mean burst, and whether its bursts come in trains, as the page */
    int train;         /* says (what a leak may let pass: hold.c) */
    int queued;        /* the prompt burst is a request that queued: no leaks into it (hold.c counts these) */
    uint64_t span;     /* the page's prompt_span_ns, with leak_from (hold.c's leaks that end in time) */
    const char *why;   /* not held while a prompt burst is announced: why (debug counts), else NULL */
    int expect;        /* the hold is for a prompt burst expected soon (burst.c's expectations), none runs yet */
    uint64_t look_by;  /* not held now: a prompt burst is expected, look again by then at the latest (0: none) */
};
int nvshare_burst_hold_now(struct nvshare_gpu *g, uint64_t now, uint64_t held_ns, struct nvshare_hold_ask *a);
/* A hold of `ns` for prompt bursts ended: it counts against the yield budget (a co-runner's ordinary
 * burst's hold counts against its own, in nvshare_burst_hold_now). */
void nvshare_burst_held(struct nvshare_gpu *g, uint64_t ns);
/* Sleep until the page's prompt_seq moves from seq (a prompt burst begins or ends), at most left_ns. */
void nvshare_burst_wait_prompts(struct nvshare_gpu *g, uint32_t seq, uint64_t left_ns);

/* A launch whose work the GPU holds (hold.c) does not wait on the host too (set around its gate). */
extern NVSHARE_TLS int nvshare_tl_launch_held;

/* Called where work enters the gate: wait while a co-runner's prompt burst runs (bounded). */
void nvshare_burst_yield(struct nvshare_gpu *g);
static inline void nvshare_burst_yield_point(struct nvshare_gpu *g)
{
    if (!atomic_load_explicit(&g->burst.yields, memory_order_relaxed) || nvshare_tl_launch_held)
        return;
    struct nvshare_burst_page *p = atomic_load_explicit(&g->burst.page, memory_order_relaxed);
    if (p && (atomic_load_explicit(&p->prompt_until, memory_order_relaxed) ||
              atomic_load_explicit(&p->prompt_next_until, memory_order_relaxed)))
        nvshare_burst_yield(g);
}

#endif
