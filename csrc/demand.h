/* demand.h: what this process asks of each GPU, sampled by a thread of its own and reported as
 * DEMAND (demand.c). It reads the gate's and the bursts' counters and tells the gate and burst.c what
 * it measured; calls gate.c, burst.c, outbox.c, gpus.c, driver.c and env.c.
 */
#ifndef NVSHARE_DEMAND_H
#define NVSHARE_DEMAND_H

/* Starts the sampler once (events.c, when the link first comes up). */
void nvshare_demand_start(void);
void nvshare_demand_after_fork(void);

#endif
