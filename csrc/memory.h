/* memory.h: the accounting of every device allocation of this process, per GPU, and what the daemon
 * is asked and told about it (memory.c). Owns `struct nvshare_mem_state` of each GPU's record. The
 * wrappers that call it are hook_memory.c's. Calls swap.c (its counters), gpus.c, client.c (start the
 * link), outbox.c, driver.c and env.c.
 */
#ifndef NVSHARE_MEMORY_H
#define NVSHARE_MEMORY_H

#include <stdint.h>

#include "gpus.h"

/* What an allocation is, as counted: a pointer, the app's own cuMemCreate handle, a mapping of such
 * a handle (counts nothing itself: the handle counts until released *and* unmapped), a CUDA array. */
enum nvshare_alloc_kind { NVSHARE_ALLOC_PTR = 1, NVSHARE_ALLOC_HANDLE = 2, NVSHARE_ALLOC_MAP = 3,
                          NVSHARE_ALLOC_ARRAY = 4 };

/* Accounted at all: this process is in a job and g is gated. */
int nvshare_memory_accounted(struct nvshare_gpu *g);
/* CUDA_SUCCESS when an allocation of `bytes` may go to the driver (a question to the daemon unless a
 * small one fits the budget). With NVSHARE_MEM_CAN_DEFER in flags, *deferred says whether the daemon
 * said to make it without GPU memory for now. *not_managed: the daemon does not gate g for this job
 * (NOGPU): the caller opens its gate for good. */
CUresult nvshare_memory_admit(struct nvshare_gpu *g, uint64_t bytes, uint32_t flags, int *deferred,
                              int *not_managed);
/* The driver answered an allocation that nvshare_memory_admit let through (`bytes` of it, or of
 * what the daemon was asked) with `rc`. The driver can disagree with the daemon's count: an ended
 * process's memory is freed some time after it ended, and processes outside nvshare hold memory.
 * On CUDA_ERROR_OUT_OF_MEMORY this tells the daemon (MEM_UPDATE with NVSHARE_MEM_DRIVER_OOM), waits
 * for its answer and a back-off, and returns 1: call the driver again. 0: return rc to the app (any
 * other rc, not accounted, NVSHARE_OOM_WAIT_SEC=0, the deadline passed, or the daemon refused);
 * giving up after waiting writes one line with the figures. The caller keeps one wait per
 * allocation, zeroed but for `flags` (those it was admitted with) and `deferred` (the admission's
 * answer), which each answer then sets. Never called with a lock of the hook held. */
struct nvshare_oom_wait {
    uint32_t flags;               /* the caller's: the admission's NVSHARE_MEM_* flags */
    int deferred;                 /* make it without GPU memory (NVSHARE_MEM_DEFERRED, with CAN_DEFER) */
    uint64_t started_ns;          /* the first refusal; 0: none yet */
    uint64_t pause_ns;            /* the next back-off */
    uint64_t available;           /* MEM_REPLY's available, last answered */
    int answered;                 /* ... when the daemon answered at all */
    unsigned tries;
};
int nvshare_memory_driver_oom(struct nvshare_gpu *g, uint64_t bytes, CUresult rc,
                              struct nvshare_oom_wait *w);
/* After the driver allocated / freed: counted and reported. Swappable memory (swap.c's) is
 * recorded even on a GPU gone pass-through meanwhile: its free is found through the table. */
void nvshare_memory_record_swappable(struct nvshare_gpu *g, uint64_t key, uint64_t size);
void nvshare_memory_record(struct nvshare_gpu *g, uint64_t key, int kind, uint64_t size);
void nvshare_memory_unrecord(uint64_t key, int kind);
/* The GPU a counted allocation lies on, or NULL. */
struct nvshare_gpu *nvshare_memory_gpu_of(uint64_t key, int kind);
/* The app's virtual memory: a handle mapped at ptr, unmapped, released. */
void nvshare_memory_mapped(uint64_t ptr, uint64_t handle);
void nvshare_memory_unmapped(uint64_t ptr);
void nvshare_memory_released(uint64_t handle);
/* Stream-ordered pools: what the pool must still reserve for `bytes`, which pools are g's, and a
 * fresh sample of their reserve (reported when it moved). */
uint64_t nvshare_memory_pool_shortfall(struct nvshare_gpu *g, CUmemoryPool pool, uint64_t bytes);
void nvshare_memory_pool_seen(struct nvshare_gpu *g, CUmemoryPool pool);
/* Forgets the pool; its GPU (NULL when not known). */
struct nvshare_gpu *nvshare_memory_pool_destroyed(CUmemoryPool pool);
struct nvshare_gpu *nvshare_memory_gpu_of_pool(CUmemoryPool pool);
void nvshare_memory_pools_changed(struct nvshare_gpu *g);
/* The job's view of the current GPU's memory: the driver's figures in, the job's out. */
void nvshare_memory_job_view(struct nvshare_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes,
                             int *not_managed);

/* MEM_UPDATE with this process's current numbers for g, through the outbox. */
void nvshare_memory_report(struct nvshare_gpu *g);
/* A report in the middle of a swap-out (NVSHARE_MEM_MOVING): the room made so far, not the answer. */
void nvshare_memory_report_moving(struct nvshare_gpu *g);
/* The report that ends a PREFETCH (NVSHARE_MEM_PREFETCH_DONE; _SHORT too when it stopped early). */
void nvshare_memory_report_prefetched(struct nvshare_gpu *g, int stopped);
/* A grant of g: memory.c's part, called once by the gate under g's gate mutex before the gate opens.
 * Returns what of g's memory is in host memory (the keeper brings it back before the gate opens);
 * answer_ask: the grant overtook a PREPARE_SWAP_OUT before it moved anything, whose answer is the
 * next report: it is sent (queued) now. */
uint64_t nvshare_memory_on_grant(struct nvshare_gpu *g, int answer_ask);
/* Every GPU's numbers again (a new connection). */
void nvshare_memory_resend(void);
struct nvshare_mem_numbers {
    uint64_t resident, fixed, swapped;
};
void nvshare_mem_numbers(struct nvshare_gpu *g, struct nvshare_mem_numbers *out);
void nvshare_memory_before_fork(void);
void nvshare_memory_parent_after_fork(void);
void nvshare_memory_after_fork(void);

#endif
