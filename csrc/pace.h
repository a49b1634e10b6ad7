/* pace.h: a job that yields to co-runners' prompt bursts keeps little of its work queued on the GPU
 * (pace.c). Owns `struct nvshare_pace_state` of each GPU's record. Calls only burst.c (are prompt
 * bursts about), hold.c (holding it on the GPU instead), gpus.c's record, driver.c and env.c.
 */
#ifndef NVSHARE_PACE_H
#define NVSHARE_PACE_H

#include <stdatomic.h>

#include "burst.h"
#include "cuda_subset.h"
#include "env.h"
#include "gpus.h"

#pragma GCC visibility push(hidden)

/* Might a launch on g be paced (the hot path's look: one load when it is not)? */
static inline int nvshare_pace_due(struct nvshare_gpu *g)
{
    return nvshare_cfg.prompt_queue_ns && atomic_load_explicit(&g->burst.yields, memory_order_relaxed);
}
/* Before a launch on g (not inside a graph capture): wait while this job's queued work is at least
 * its cap (pace.c): NVSHARE_PACE_HOST; or, where the GPU can hold it (hold.c), wait for nothing:
 * NVSHARE_PACE_HOLD, and call nvshare_pace_hold() inside the gate, before the launch. Either way
 * tell nvshare_pace_launched() once it is made; 0: not paced. The caller counts the wait as a
 * synchronise (waiting for its own work: busy, for demand.c). */
enum { NVSHARE_PACE_HOST = 1, NVSHARE_PACE_HOLD = 2 };
int nvshare_pace_wait(struct nvshare_gpu *g);
/* A launch's shape: its kernel (fn) at a grid and block of that many threads; a graph launch passes
 * its executable as fn. Never 0. */
static inline uintptr_t nvshare_pace_shape_key(uintptr_t fn, uint64_t grid, uint64_t block)
{
    uintptr_t key = fn ^ (uintptr_t)(grid * 0x9e3779b97f4a7c15ull) ^ (uintptr_t)(block << 40);
    return key ? key : 1;
}
/* A launch of `shape` (0: unknown) whose work the GPU holds goes into `stream`: a wait goes in
 * before it when the launches since the last add up to a segment, or when its shape or the last
 * launch's ran a segment or longer. */
void nvshare_pace_hold(struct nvshare_gpu *g, CUstream stream, uintptr_t shape);
/* A paced launch was made on `stream` (as the launch named it: NULL is the legacy stream, or the
 * thread's own for a _ptsz entry point, which passes CU_STREAM_PER_THREAD instead); held, its shape
 * is the one nvshare_pace_hold() was given. */
void nvshare_pace_launched(struct nvshare_gpu *g, CUstream stream);
/* Before a copy or set into a stream on g (nvshare_pace_due, no graph capture): will the GPU hold it
 * (NVSHARE_HOLD_COPIES, hold.c ready, prompt bursts heeded)? Then it does not wait on the host either,
 * and nvshare_pace_hold_copy() puts a wait before it, inside the gate. */
int nvshare_pace_copy_held(struct nvshare_gpu *g);
void nvshare_pace_hold_copy(struct nvshare_gpu *g, CUstream stream);
void nvshare_pace_after_fork(void);

#pragma GCC visibility pop

#endif
