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
 * of a co-runner does. 0 when the driver refused it (holding is then off for this process). */
int nvshare_hold_wait(struct nvshare_gpu *g, CUstream stream);
void nvshare_hold_after_fork(void);

#pragma GCC visibility pop

#endif
