/* burst.h: co-running jobs on one GPU take turns burst by burst, through a page they share
 * (burst.c). Owns `struct nvshare_burst_state` of each GPU's record. Calls only gpus.c's record and
 * env.c.
 */
#ifndef NVSHARE_BURST_H
#define NVSHARE_BURST_H

#include <stdint.h>

#include "gpus.h"

/* One page per GPU, shared by the jobs co-running on it; nothing in it is trusted. */
struct nvshare_burst_page {
    _Atomic uint32_t owner;       /* the token of the job whose burst runs, 0: none */
    _Atomic uint32_t seq;         /* futex word: bumped at every burst's end */
    _Atomic uint32_t waiters;     /* a hint: jobs waiting on seq */
    uint32_t pad;
};
/* The page the daemon passed (BURST_PAGE); takes fd. 0 when mapped, -1 when refused. */
int nvshare_burst_attach(struct nvshare_gpu *g, int fd);
/* Bursts take turns from now on (a shared grant), when the page has come; off: they do not. */
void nvshare_burst_arm(struct nvshare_gpu *g, int on);
void nvshare_burst_begin(struct nvshare_gpu *g);
void nvshare_burst_end(struct nvshare_gpu *g);
/* The mean length of this process's bursts on g (demand.c measures it): how long to wait for others. */
void nvshare_burst_note_mean(struct nvshare_gpu *g, uint64_t mean_ns);
void nvshare_burst_after_fork(void);

#endif
