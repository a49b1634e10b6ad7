/* swap.h: the mechanism that moves memory between a GPU and host memory (swap.c). Owns
 * `struct nvshare_swap_state` of each GPU's record. Calls gpus.c, driver.c and env.c; takes the
 * gate's mutex of a GPU (never calls the gate) to decide whether a new allocation is born swapped.
 */
#ifndef NVSHARE_SWAP_H
#define NVSHARE_SWAP_H

#include <stddef.h>
#include <stdint.h>

#include "gpus.h"

/* The size a swappable allocation of `size` bytes takes on g, or 0 when it is not backed that way. */
size_t nvshare_swap_size(struct nvshare_gpu *g, size_t size);
/* Makes it; deferred = address only, counted as swapped. CUDA_ERROR_NOT_SUPPORTED: use cuMemAlloc. */
CUresult nvshare_swap_alloc(struct nvshare_gpu *g, CUdeviceptr *dptr, size_t size, int deferred);
/* Frees va if it is a swappable allocation of g: 1 (rc in *rc) or 0 when it is not one. */
int nvshare_swap_free(struct nvshare_gpu *g, CUdeviceptr va, CUresult *rc);
/* The whole swappable allocation that ptr lies in (what cuMemAlloc would describe): its GPU, or NULL. */
struct nvshare_gpu *nvshare_swap_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);
/* Another GPU's kernels may reach g's memory from now on: it is never swapped. 1 the first time. */
int nvshare_swap_keep_resident(struct nvshare_gpu *g);
/* swap.mu of g: held around swap-out and swap-in, and by allocations and frees of swappable memory. */
void nvshare_swap_lock(struct nvshare_gpu *g);
void nvshare_swap_unlock(struct nvshare_gpu *g);
/* Stop a swap-out between chunks (on: a grant came during a PREPARE_SWAP_OUT swap, or the job runs
 * again after the suspend that asked for it) / the next swap-out may run to its end (off). */
void nvshare_swap_set_abort(struct nvshare_gpu *g, int on);
/* A grant of g: swap.c's part, called once by the gate under g's gate mutex before the gate opens.
 * stop_out: a swap-out for a PREPARE_SWAP_OUT is under way, and the grant overtakes it: it stops
 * between chunks (as nvshare_swap_set_abort(g, 1)). ahead: the grant said NVSHARE_GRANT_SWAP_AHEAD:
 * with NVSHARE_SWAP_PREPIN=ahead (the default when unset), the host copies of the newest chunks up to
 * `bytes` (0: all) are pinned ahead, in the prepin thread (returns at once). */
void nvshare_swap_on_grant(struct nvshare_gpu *g, int stop_out, int ahead, uint64_t bytes);
/* Under nvshare_swap_lock, with g's gate shut and its work drained: moves at least `bytes`
 * (UINT64_MAX: all) to host memory; returns the bytes moved. The counters follow each chunk (at
 * most 256 MiB), and progress(g), when given, is called after each chunk but the last, so that the
 * next holder can bring its memory back into the room made so far. */
uint64_t nvshare_swap_out(struct nvshare_gpu *g, uint64_t bytes, void (*progress)(struct nvshare_gpu *));
/* Under nvshare_swap_lock, gate shut: brings all of g's swapped memory back; 0 when all is resident. */
int nvshare_swap_in(struct nvshare_gpu *g);
/* Under nvshare_swap_lock, gate shut, not holding the GPU (PREFETCH): brings back whole chunks of
 * g's swapped memory, at most `limit` bytes in all; *moved = what came back. 0 when it stopped only
 * for the limit or because all is resident, -1 when the driver refused (no room on the GPU). */
int nvshare_swap_prefetch(struct nvshare_gpu *g, uint64_t limit, uint64_t *moved);
void nvshare_swap_after_fork(void);

/* CUDA IPC (ipc.c) of swappable memory. */
struct nvshare_swap_export {
    CUdeviceptr base;      /* the whole allocation, as cuIpcGetMemHandle on real cuMemAlloc memory */
    size_t size;
    size_t chunk_bytes;    /* every chunk this size, the last one the rest */
    size_t n;
    int *fds;              /* one exported handle per chunk (malloc'd; the caller owns them) */
    uint64_t newly_fixed;  /* bytes that were swappable until now */
};
/* With the caller inside g's gate (so it is resident): fixes the allocation that ptr lies in for good
 * and exports its chunks. NOT_SUPPORTED where the GPU cannot export them as file descriptors. */
CUresult nvshare_swap_export(struct nvshare_gpu *g, CUdeviceptr ptr, struct nvshare_swap_export *out);

#endif
