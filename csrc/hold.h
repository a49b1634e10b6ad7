/* hold.h: a job that yields to co-runners' prompt bursts keeps its work queued, and the GPU holds it
 * while one runs (hold.c). Owns `struct nvshare_hold_state` of each GPU's record. Calls only burst.c
 * (is a prompt burst running, the yield budget), gpus.c's record, driver.c and env.c.
 */
#ifndef NVSHARE_HOLD_H
#define NVSHARE_HOLD_H

#include "cuda_subset.h"
#include "gpus.h"

#pragma GCC visibility push(hidden)

/* Can this process's launches on g, in the current context, be held on the GPU? Makes the word and
 * starts its watcher the first time; 0 when the driver cannot (pace.c then waits on the host). */
int nvshare_hold_ready(struct nvshare_gpu *g);
/* Put a wait for the word into `stream` (before a launch): what follows runs once no prompt burst
 * of a co-runner does. 0 when the driver refused it (holding is then off for this process). With
 * `long_kernel`, before a kernel that runs a segment or longer (pace.c): a leak lets it pass only into
 * a prompt burst it fits. */
int nvshare_hold_wait(struct nvshare_gpu *g, CUstream stream, int long_kernel);
/* pace.c measured a kernel that gets waits of its own running `ns`: what a leak weighs (hold.c). */
static inline void nvshare_hold_long_kernel(struct nvshare_gpu *g, uint64_t ns)
{
    uint64_t was = atomic_load_explicit(&g->hold.long_ns, memory_order_relaxed);
    while (ns > was && !atomic_compare_exchange_weak(&g->hold.long_ns, &was, ns))
        ;
}
/* How many times this process's queue on g has been held so far (the word set): two events
 * recorded with the same count, the later seen done with it still, had no hold between them. */
static inline unsigned nvshare_hold_count(struct nvshare_gpu *g)
{
    return atomic_load_explicit(&g->hold.holds, memory_order_acquire);
}
/* Is the queue held now (the word set)? */
static inline int nvshare_hold_on(struct nvshare_gpu *g)
{
    _Atomic(uint32_t) *w = atomic_load_explicit(&g->hold.word, memory_order_acquire);
    return w && atomic_load_explicit(w, memory_order_relaxed);
}
void nvshare_hold_after_fork(void);

#pragma GCC visibility pop

#endif
