/* gate.h: the lock of each GPU and the gate every GPU-bound call passes (gate.c). Owns
 * `struct nvshare_gate_state` of each GPU's record. The hot path (enter, leave) is here, inline.
 *
 * Calls down only: memory.c (numbers, reports), swap.c (moving memory), burst.c, gpus.c, client.c
 * (start the link), outbox.c (what it tells the daemon), driver.c, env.c. What the daemon says
 * arrives as nvshare_gate_on_*() calls from events.c, above.
 */
#ifndef NVSHARE_GATE_H
#define NVSHARE_GATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "burst.h"
#include "driver.h"
#include "env.h"
#include "gpus.h"

/* Hidden as declared (driver.h says why). */
#pragma GCC visibility push(hidden)

/* Called with the gate found shut: ask for the lock if nobody has, then wait for the grant. */
void nvshare_gate_wait(struct nvshare_gpu *g);

/* Graph captures this thread has open: its calls only record work, so they pass. */
extern NVSHARE_TLS atomic_int nvshare_tl_capturing;
void nvshare_capture_began(struct nvshare_gpu *g, CUstream stream);
void nvshare_capture_ended(CUstream stream);

/* Entering: announce first, then look; a release sets closing first, then waits for inside == 0.
 * Both sides use sequentially consistent atomics, so one of them always sees the other. */
static inline struct nvshare_gpu *nvshare_gate_enter(struct nvshare_gpu *g)
{
    if (!g)
        return NULL;
    /* A burst begun here is announced before this thread is inside: the demand sampler, which ends
     * a burst it finds idle, leaves it be until then (preempted in between on a loaded CPU, an
     * interactive command's burst read as ended before its kernel was launched, and the training
     * beside it ran unheld for 5-20 ms). */
    int beginning = 0;
    if (!atomic_load_explicit(&nvshare_tl_capturing, memory_order_relaxed)) {
        if (atomic_load_explicit(&g->burst.armed, memory_order_relaxed) &&
            !atomic_load_explicit(&g->burst.in_burst, memory_order_relaxed)) {
            beginning = 1;
            atomic_fetch_add(&g->gate.beginning, 1);
            nvshare_burst_begin(g);
        }
        nvshare_burst_yield_point(g);
    }
    for (;;) {
        atomic_fetch_add(&g->gate.inside, 1);
        if (beginning) {
            beginning = 0;
            atomic_fetch_sub(&g->gate.beginning, 1);
        }
        if (atomic_load(&g->gate.open) && !atomic_load(&g->gate.closing)) {
            if (!atomic_load_explicit(&g->gate.touched, memory_order_relaxed))
                atomic_store_explicit(&g->gate.touched, 1, memory_order_relaxed);
            if (!atomic_load_explicit(&g->gate.demand_touched, memory_order_relaxed))
                atomic_store_explicit(&g->gate.demand_touched, 1, memory_order_relaxed);
            return g;
        }
        if (atomic_load_explicit(&nvshare_tl_capturing, memory_order_relaxed))
            return g;
        atomic_fetch_sub(&g->gate.inside, 1);
        nvshare_gate_wait(g);
    }
}

/* A graph capture is open on g, by this thread or another: work only recorded, or a stream that
 * must not be touched (the hook then adds no work of its own, pace.c's events). */
static inline int nvshare_gate_capturing(struct nvshare_gpu *g)
{
    return atomic_load_explicit(&nvshare_tl_capturing, memory_order_relaxed) ||
           atomic_load_explicit(&g->gate.captures, memory_order_relaxed);
}

static inline void nvshare_gate_leave(struct nvshare_gpu *g)
{
    if (g)
        atomic_fetch_sub_explicit(&g->gate.inside, 1, memory_order_release);
}

/* A thread waits in a synchronising call for g's work: counted as demand, never gated. end returns
 * 1 for the last one out. The first in and the last out note the time (a synchronising call costs
 * far more than the clock): the demand sampler splits a sample it overslept by them. */
static inline void nvshare_gate_sync_begin(struct nvshare_gpu *g)
{
    if (atomic_fetch_add_explicit(&g->gate.syncing, 1, memory_order_relaxed) == 0)
        atomic_store_explicit(&g->gate.sync_began_ns, nvshare_now_ns(), memory_order_relaxed);
}

static inline int nvshare_gate_sync_end(struct nvshare_gpu *g)
{
    if (atomic_fetch_sub(&g->gate.syncing, 1) != 1)
        return 0;
    atomic_store_explicit(&g->gate.sync_ended_ns, nvshare_now_ns(), memory_order_relaxed);
    return 1;
}

/* For the demand sampler: did work enter the gate since the last look (and forget it). */
static inline int nvshare_gate_take_touched(struct nvshare_gpu *g)
{
    return atomic_exchange_explicit(&g->gate.demand_touched, 0, memory_order_relaxed);
}

/* What the demand sampler saw, for the keeper: idle since (0: busy), mean pause, busy share. */
void nvshare_gate_note_demand(struct nvshare_gpu *g, uint64_t idle_since_ns, uint64_t gap_mean_ns,
                              unsigned busy_ppm);
/* Not this job's GPU as far as the daemon knows (a NOGPU answer to a memory question): open for good. */
void nvshare_gate_pass_through(struct nvshare_gpu *g);

/* Events from the daemon (events.c). */
/* bytes: with SWAP_AHEAD, what of this job's memory the GPU lacks room for (pinned ahead). */
void nvshare_gate_on_grant(struct nvshare_gpu *g, uint32_t flags, uint32_t switch_ms, uint64_t bytes);
void nvshare_gate_on_contended(struct nvshare_gpu *g, uint64_t bytes);
void nvshare_gate_on_drop(struct nvshare_gpu *g, uint32_t reason, uint64_t bytes);
void nvshare_gate_on_prepare_swap_out(struct nvshare_gpu *g, uint64_t bytes);
/* PREFETCH: waiting, bring up to `bytes` of swapped memory back now; answered when done. */
void nvshare_gate_on_prefetch(struct nvshare_gpu *g, uint64_t bytes);
/* RESUMED: the job runs again after a suspend; a swap-out pending or under way stops. */
void nvshare_gate_on_resumed(struct nvshare_gpu *g);
/* HANDOFF (NVSHARE_HANDOFF_FROM or _TO) with its eventfd, which the gate then owns. */
void nvshare_gate_on_handoff(struct nvshare_gpu *g, uint32_t role, int fd);
void nvshare_gate_on_request_refused(uint32_t seq, int32_t status, const char *message);
void nvshare_gate_on_connection_change(int connected);
void nvshare_gates_open_all(void);
void nvshare_gate_after_fork(void);

#pragma GCC visibility pop

#endif
