/* memory.c: every device allocation of this process, per GPU, told to the daemon.
 *
 * Before an allocation the hook asks (MEM_UPDATE with request > 0) and waits for MEM_REPLY; a refusal
 * becomes CUDA_ERROR_OUT_OF_MEMORY without calling the driver. After it, and after every free, it
 * reports the new numbers (request = 0): resident bytes, the fixed part of them, and swapped bytes.
 * cuMemAlloc_v2 (what cudaMalloc becomes) is backed by swap.c when it can be, so that it can move to
 * host memory; everything else is fixed. cuMemGetInfo shows the job's view: the smaller of what the
 * driver says and what the daemon allows.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "nvshare_hook.h"

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;

enum { KIND_PTR = 1, KIND_HANDLE = 2 };
struct alloc {
    uint64_t key;      /* device pointer, or generic allocation handle */
    uint64_t size;
    struct nvshare_gpu *gpu;
    int kind;          /* 0 = empty slot, -1 = removed */
};
static struct alloc *allocs;
static size_t alloc_cap, alloc_used;  /* used counts live and removed slots */

static size_t slot_of(uint64_t key, int kind, size_t cap)
{
    uint64_t h = (key ^ (uint64_t)kind * 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
    return (size_t)(h >> 17) & (cap - 1);
}

static int grow(void)
{
    size_t cap = alloc_cap ? alloc_cap * 2 : 1024;
    struct alloc *fresh = calloc(cap, sizeof *fresh);
    if (!fresh)
        return -1;
    size_t live = 0;
    for (size_t i = 0; i < alloc_cap; i++) {
        if (allocs[i].kind <= 0)
            continue;
        size_t s = slot_of(allocs[i].key, allocs[i].kind, cap);
        while (fresh[s].kind)
            s = (s + 1) & (cap - 1);
        fresh[s] = allocs[i];
        live++;
    }
    free(allocs);
    allocs = fresh;
    alloc_cap = cap;
    alloc_used = live;
    return 0;
}

/* With mem_mu held. */
static void remember(uint64_t key, int kind, uint64_t size, struct nvshare_gpu *g)
{
    if ((alloc_used + 1) * 2 > alloc_cap && grow() != 0) {
        nvshare_log("gpu %s: out of host memory for allocation bookkeeping; %llu bytes not tracked",
                    g->uuid, (unsigned long long)size);
        return;
    }
    size_t s = slot_of(key, kind, alloc_cap);
    while (allocs[s].kind > 0)
        s = (s + 1) & (alloc_cap - 1);
    if (allocs[s].kind == 0)
        alloc_used++;
    allocs[s] = (struct alloc){key, size, g, kind};
    g->allocated += size;
}

/* With mem_mu held: the live entry for (key, kind), or NULL. */
static struct alloc *find(uint64_t key, int kind)
{
    if (!alloc_cap)
        return NULL;
    for (size_t s = slot_of(key, kind, alloc_cap); allocs[s].kind; s = (s + 1) & (alloc_cap - 1))
        if (allocs[s].kind == kind && allocs[s].key == key)
            return &allocs[s];
    return NULL;
}

/* With mem_mu held; the GPU it was on, or NULL when the hook never saw it. */
static struct nvshare_gpu *forget(uint64_t key, int kind)
{
    struct alloc *a = find(key, kind);
    if (!a)
        return NULL;
    a->gpu->allocated -= a->size;
    a->kind = -1;
    return a->gpu;
}

static uint64_t allocated_on(struct nvshare_gpu *g)
{
    pthread_mutex_lock(&mem_mu);
    uint64_t v = g->allocated;
    pthread_mutex_unlock(&mem_mu);
    return v;
}

void nvshare_mem_numbers(struct nvshare_gpu *g, struct nvshare_mem_numbers *out)
{
    pthread_mutex_lock(&mem_mu);
    uint64_t swapped = g->swapped < g->allocated ? g->swapped : g->allocated;
    out->resident = g->allocated - swapped;
    uint64_t swappable = g->swap_blocked ? 0 : g->swappable;
    out->fixed = swappable < out->resident ? out->resident - swappable : 0;
    out->swapped = swapped;
    pthread_mutex_unlock(&mem_mu);
}

void nvshare_mem_moved(struct nvshare_gpu *g, int64_t d_swappable, int64_t d_swapped)
{
    pthread_mutex_lock(&mem_mu);
    g->swappable = (uint64_t)((int64_t)g->swappable + d_swappable);
    g->swapped = (uint64_t)((int64_t)g->swapped + d_swapped);
    pthread_mutex_unlock(&mem_mu);
}

static int accounted(struct nvshare_gpu *g)
{
    return g && nvshare_cfg.active && atomic_load(&g->mode) != GPU_PASS;
}

/* CUDA_SUCCESS when the allocation may go to the driver. With NVSHARE_MEM_CAN_DEFER in flags,
 * *deferred says whether the daemon said to make it without GPU memory for now. */
static CUresult admit(struct nvshare_gpu *g, uint64_t bytes, uint32_t flags, int *deferred)
{
    if (deferred)
        *deferred = 0;
    if (!accounted(g) || bytes == 0)
        return CUDA_SUCCESS;
    uint64_t allocated = allocated_on(g);
    if (nvshare_cfg.mem_limit && allocated + bytes > nvshare_cfg.mem_limit) {
        nvshare_log("gpu %s: allocation of %llu bytes refused: this process would hold %llu bytes, "
                    "over NVSHARE_MEM_LIMIT (%llu)", g->uuid, (unsigned long long)bytes,
                    (unsigned long long)(allocated + bytes), (unsigned long long)nvshare_cfg.mem_limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct nvshare_mem_reply reply;
    int answered;
    if (nvshare_mem_request(g, bytes, flags, &reply, &answered)) {
        nvshare_log("gpu %s: allocation of %llu bytes refused by nvshare-scheduler: the job may still "
                    "allocate %llu of %llu bytes here", g->uuid, (unsigned long long)bytes,
                    (unsigned long long)reply.available, (unsigned long long)reply.total);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (deferred)
        *deferred = answered && (reply.flags & NVSHARE_MEM_DEFERRED);
    return CUDA_SUCCESS;
}

static void record(struct nvshare_gpu *g, uint64_t key, int kind, uint64_t size)
{
    if (!accounted(g) || size == 0 || nvshare_in_hook)
        return;
    pthread_mutex_lock(&mem_mu);
    remember(key, kind, size, g);
    pthread_mutex_unlock(&mem_mu);
    nvshare_send_mem_report(g);
}

static void unrecord(uint64_t key, int kind)
{
    if (!nvshare_cfg.active || nvshare_in_hook)
        return;
    pthread_mutex_lock(&mem_mu);
    struct nvshare_gpu *g = forget(key, kind);
    pthread_mutex_unlock(&mem_mu);
    if (g && atomic_load(&g->mode) != GPU_PASS)
        nvshare_send_mem_report(g);
}

void nvshare_memory_resend(void)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        if (allocated_on(g) && atomic_load(&g->mode) != GPU_PASS)
            nvshare_send_mem_report(g);
    }
}

void nvshare_memory_after_fork(void)
{
    pthread_mutex_init(&mem_mu, NULL);
    /* Device memory belongs to the parent's contexts, not to the child. */
    free(allocs);
    allocs = NULL;
    alloc_cap = alloc_used = 0;
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++)
        nvshare_gpus[i].allocated = nvshare_gpus[i].swappable = nvshare_gpus[i].swapped = 0;
}

#define REAL_OR_FAIL(name)                                                                       \
    do {                                                                                         \
        if (nvshare_load_driver() != 0)                                                          \
            return CUDA_ERROR_NOT_INITIALIZED;                                                   \
        if (!nvshare_real.name)                                                                  \
            return CUDA_ERROR_NOT_FOUND;                                                         \
    } while (0)

/* ---- allocations ---------------------------------------------------------------------------- */
#define ALLOC_WRAPPER(name, params, call, ptr_expr, size_expr, request_expr)                     \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *g = nvshare_gpu_for_current();                                       \
        CUresult rc = admit(g, (request_expr), 0, NULL);                                         \
        if (rc != CUDA_SUCCESS)                                                                  \
            return rc;                                                                           \
        nvshare_in_hook++;                                                                       \
        rc = nvshare_real.name call;                                                             \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS)                                                                  \
            record(g, (uint64_t)(ptr_expr), KIND_PTR, (size_expr));                              \
        return rc;                                                                               \
    }

ALLOC_WRAPPER(cuMemAlloc, (CUdeviceptr_v1 *dptr, unsigned int bytesize), (dptr, bytesize), *dptr,
              bytesize, bytesize)
ALLOC_WRAPPER(cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elementSize),
              (dptr, pitch, width, height, elementSize), *dptr, (uint64_t)*pitch * height,
              (uint64_t)width * height)
ALLOC_WRAPPER(cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags),
              (dptr, bytesize, flags), *dptr, bytesize, bytesize)
ALLOC_WRAPPER(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream stream),
              (dptr, bytesize, stream), *dptr, bytesize, bytesize)
ALLOC_WRAPPER(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream stream),
              (dptr, bytesize, stream), *dptr, bytesize, bytesize)
ALLOC_WRAPPER(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream stream),
              (dptr, bytesize, pool, stream), *dptr, bytesize, bytesize)
ALLOC_WRAPPER(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream stream),
              (dptr, bytesize, pool, stream), *dptr, bytesize, bytesize)

/* cudaMalloc's way in: backed so that it can be swapped (swap.c) when it is large enough. */
NVSHARE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL_OR_FAIL(cuMemAlloc_v2);
    struct nvshare_gpu *g = nvshare_gpu_for_current();
    size_t swappable = accounted(g) ? nvshare_swap_size(g, bytesize) : 0;
    int deferred;
    CUresult rc = admit(g, swappable ? swappable : bytesize, swappable ? NVSHARE_MEM_CAN_DEFER : 0,
                        &deferred);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (swappable && dptr) {
        rc = nvshare_swap_alloc(g, dptr, swappable, deferred);
        if (rc == CUDA_SUCCESS) {
            record(g, (uint64_t)*dptr, KIND_PTR, swappable);
            return rc;
        }
        if (rc != CUDA_ERROR_NOT_SUPPORTED)
            return rc;
    }
    nvshare_in_hook++;
    rc = nvshare_real.cuMemAlloc_v2(dptr, bytesize);
    nvshare_in_hook--;
    if (rc == CUDA_SUCCESS)
        record(g, (uint64_t)*dptr, KIND_PTR, bytesize);
    return rc;
}

NVSHARE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL_OR_FAIL(cuMemCreate);
    struct nvshare_gpu *g = NULL;
    if (nvshare_cfg.active && !nvshare_in_hook && prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        g = nvshare_gpu_for_device(prop->location.id);
    CUresult rc = admit(g, size, 0, NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    nvshare_in_hook++;
    rc = nvshare_real.cuMemCreate(handle, size, prop, flags);
    nvshare_in_hook--;
    if (rc == CUDA_SUCCESS)
        record(g, *handle, KIND_HANDLE, size);
    return rc;
}

/* ---- frees ---------------------------------------------------------------------------------- */
#define FREE_WRAPPER(name, params, call, key, kind)                                              \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        nvshare_in_hook++;                                                                       \
        CUresult rc = nvshare_real.name call;                                                    \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS)                                                                  \
            unrecord((uint64_t)(key), kind);                                                     \
        return rc;                                                                               \
    }

/* 1 when dptr was a swappable allocation and is freed now (its result in *rc). */
static int free_swappable(CUdeviceptr dptr, CUresult *rc)
{
    if (!nvshare_cfg.active || nvshare_in_hook || !dptr)
        return 0;
    pthread_mutex_lock(&mem_mu);
    struct alloc *a = find((uint64_t)dptr, KIND_PTR);
    struct nvshare_gpu *g = a ? a->gpu : NULL;
    pthread_mutex_unlock(&mem_mu);
    if (!g || !nvshare_swap_free(g, dptr, rc))
        return 0;
    if (*rc == CUDA_SUCCESS)
        unrecord((uint64_t)dptr, KIND_PTR);
    return 1;
}

#define FREE_SWAPPABLE_WRAPPER(name, params, call)                                               \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        CUresult rc;                                                                             \
        if (free_swappable(dptr, &rc))                                                           \
            return rc;                                                                           \
        nvshare_in_hook++;                                                                       \
        rc = nvshare_real.name call;                                                             \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS)                                                                  \
            unrecord((uint64_t)dptr, KIND_PTR);                                                  \
        return rc;                                                                               \
    }

FREE_WRAPPER(cuMemFree, (CUdeviceptr_v1 dptr), (dptr), dptr, KIND_PTR)
FREE_SWAPPABLE_WRAPPER(cuMemFree_v2, (CUdeviceptr dptr), (dptr))
/* A stream-ordered free of a swappable allocation frees it at once: it waits for the device first. */
FREE_SWAPPABLE_WRAPPER(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream))
FREE_SWAPPABLE_WRAPPER(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream))
FREE_WRAPPER(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle), handle, KIND_HANDLE)

/* ---- the job's view ------------------------------------------------------------------------- */
static void job_view(uint64_t *free_bytes, uint64_t *total_bytes)
{
    struct nvshare_gpu *g = nvshare_gpu_for_current();
    if (!accounted(g))
        return;
    uint64_t allocated = allocated_on(g);
    uint64_t total = *total_bytes, avail = *free_bytes;
    if (nvshare_cfg.mem_limit && nvshare_cfg.mem_limit < total) {
        total = nvshare_cfg.mem_limit;
        uint64_t left = allocated < total ? total - allocated : 0;
        avail = avail < left ? avail : left;
    }
    struct nvshare_mem_reply reply;
    int answered = 0;
    /* A one-byte question: the reply carries the job's view whatever its verdict. */
    nvshare_mem_request(g, 1, 0, &reply, &answered);
    if (answered) {
        if (reply.total && reply.total < total)
            total = reply.total;
        if (reply.available < avail)
            avail = reply.available;
    }
    if (avail > total)
        avail = total;
    *total_bytes = total;
    *free_bytes = avail;
}

NVSHARE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    REAL_OR_FAIL(cuMemGetInfo_v2);
    CUresult rc = nvshare_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS || !free_bytes || !total_bytes)
        return rc;
    uint64_t f = *free_bytes, t = *total_bytes;
    job_view(&f, &t);
    *free_bytes = (size_t)f;
    *total_bytes = (size_t)t;
    return rc;
}

NVSHARE_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    REAL_OR_FAIL(cuMemGetInfo);
    CUresult rc = nvshare_real.cuMemGetInfo(free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS || !free_bytes || !total_bytes)
        return rc;
    uint64_t f = *free_bytes, t = *total_bytes;
    job_view(&f, &t);
    *free_bytes = (unsigned int)f;
    *total_bytes = (unsigned int)t;
    return rc;
}
