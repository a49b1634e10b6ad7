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

/* KIND_HANDLE: the app's own cuMemCreate. It holds GPU memory until released *and* unmapped, so a
 * handle released while mapped stays counted until its last KIND_MAP entry (key = address) goes. */
enum { KIND_PTR = 1, KIND_HANDLE = 2, KIND_MAP = 3, KIND_ARRAY = 4 };
struct alloc {
    uint64_t key;      /* device pointer, generic allocation handle, or mapped address */
    uint64_t size;     /* bytes counted (0 for KIND_MAP) */
    struct nvshare_gpu *gpu;
    int kind;          /* 0 = empty slot, -1 = removed */
    uint64_t handle;   /* KIND_MAP: its handle */
    int mapped;        /* KIND_HANDLE: live mappings */
    int released;      /* KIND_HANDLE: cuMemRelease came while mapped */
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
    allocs[s] = (struct alloc){key, size, g, kind, 0, 0, 0};
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
    /* swappable and swapped belong to swap.c (atomics): a report may see one move half done. */
    uint64_t pools = atomic_load(&g->pool_bytes);
    pthread_mutex_lock(&mem_mu);
    uint64_t in_swap = atomic_load(&g->swapped);
    uint64_t swapped = in_swap < g->allocated ? in_swap : g->allocated;
    out->resident = g->allocated - swapped + pools;
    uint64_t swappable = g->swap_blocked ? 0 : atomic_load(&g->swappable);
    out->fixed = swappable < out->resident ? out->resident - swappable : 0;
    out->swapped = swapped;
    pthread_mutex_unlock(&mem_mu);
}

/* The pools' reserved memory on g (async allocations, freed or not), sampled from the driver. */
static uint64_t pool_reserved(struct nvshare_gpu *g);

static void fill_mem_update(struct nvshare_mem_update *m, struct nvshare_gpu *g, uint64_t request,
                            uint32_t flags)
{
    struct nvshare_mem_numbers numbers;
    nvshare_mem_numbers(g, &numbers);
    memset(m, 0, sizeof *m);
    nvshare_copy_str(m->gpu_uuid, sizeof m->gpu_uuid, g->uuid);
    m->allocated = numbers.resident;
    m->fixed = numbers.fixed;
    m->swapped = numbers.swapped;
    m->request = request;
    m->flags = flags;
}

void nvshare_memory_report(struct nvshare_gpu *g)
{
    if (!nvshare_outbox_connected())
        return;
    if (atomic_load(&g->mode) != GPU_PASS)
        atomic_store(&g->pool_bytes, pool_reserved(g));
    struct nvshare_mem_update m;
    fill_mem_update(&m, g, 0, 0);
    nvshare_outbox_mem_update(&m);
}

/* Asks before allocating: 0 = allowed (the reply in *reply when *answered), 1 = refused. */
static int ask_daemon(struct nvshare_gpu *g, uint64_t request, uint32_t flags,
                      struct nvshare_mem_reply *reply, int *answered)
{
    *answered = 0;
    nvshare_outbox_want_link();
    if (atomic_load(&g->mode) == GPU_PASS)
        return 0;
    struct nvshare_mem_update question;
    fill_mem_update(&question, g, request, flags);
    int32_t status = NVSHARE_OK;
    if (nvshare_outbox_ask(&question, &status, reply) != NVSHARE_ASK_ANSWERED)
        return 0;  /* no daemon: 'run' passes, a refused client runs unshared */
    if (status == NVSHARE_ERR_NOGPU) {
        /* Not this job's GPU as far as the daemon knows: the gate opens for good (as on a refused
         * LOCK_REQUEST); memory.c only flips the two atomics the gate's hot path reads. */
        atomic_store(&g->mode, GPU_PASS);
        atomic_store(&g->open, 1);
        return 0;
    }
    *answered = 1;
    return status == NVSHARE_ERR_NOMEM ? 1 : 0;
}

/* Small allocations, which the daemon answers at once and never defers nor holds for room
 * (gpustate.SMALL_REQUEST), are admitted here after an answer, up to a sixteenth of the headroom
 * that answer left (at most SMALL_BUDGET_MAX); each is reported as every allocation is, and the
 * first one past that asks again. Asking is a round trip to the daemon, which programs allocating
 * small buffers often paid on every call (tens to hundreds of microseconds). One process cannot
 * pass its job's limit this way; the processes of one job at once, past sixteen of them, by at
 * most SMALL_BUDGET_MAX each. */
#define SMALL_REQUEST_BYTES (2ull << 20)
#define SMALL_BUDGET_MAX (16ull << 20)

static int take_small_budget(struct nvshare_gpu *g, uint64_t bytes)
{
    uint64_t have = atomic_load(&g->small_budget);
    while (have >= bytes)
        if (atomic_compare_exchange_weak(&g->small_budget, &have, have - bytes))
            return 1;
    return 0;
}

static void set_small_budget(struct nvshare_gpu *g, int refused, const struct nvshare_mem_reply *reply,
                             uint64_t bytes)
{
    uint64_t left = nvshare_cfg.alloc_budget && !refused && reply->available > bytes
                  ? (reply->available - bytes) / 16 : 0;
    atomic_store(&g->small_budget, left < SMALL_BUDGET_MAX ? left : SMALL_BUDGET_MAX);
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
    if (bytes < SMALL_REQUEST_BYTES && !flags && take_small_budget(g, bytes))
        return CUDA_SUCCESS;
    struct nvshare_mem_reply reply;
    int answered;
    int refused = ask_daemon(g, bytes, flags, &reply, &answered);
    if (answered)
        set_small_budget(g, refused, &reply, bytes);
    if (refused) {
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
    nvshare_memory_report(g);
}

static void unrecord(uint64_t key, int kind)
{
    if (!nvshare_cfg.active || nvshare_in_hook)
        return;
    pthread_mutex_lock(&mem_mu);
    struct nvshare_gpu *g = forget(key, kind);
    pthread_mutex_unlock(&mem_mu);
    if (g && atomic_load(&g->mode) != GPU_PASS)
        nvshare_memory_report(g);
}

void nvshare_memory_resend(void)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        atomic_store(&g->small_budget, 0);   /* a new daemon: its first answer sets it */
        if (allocated_on(g) && atomic_load(&g->mode) != GPU_PASS)
            nvshare_memory_report(g);
    }
}

/* fork() while another thread is inside grow() would leave the child a table half moved: the
 * bookkeeping is held across fork (pthread_atfork in hook.c) and the child starts clean. */
void nvshare_memory_before_fork(void) { pthread_mutex_lock(&mem_mu); }
void nvshare_memory_parent_after_fork(void) { pthread_mutex_unlock(&mem_mu); }

void nvshare_memory_after_fork(void)
{
    pthread_mutex_init(&mem_mu, NULL);
    /* Device memory belongs to the parent's contexts, not to the child. */
    free(allocs);
    allocs = NULL;
    alloc_cap = alloc_used = 0;
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        nvshare_gpus[i].allocated = 0;
        atomic_store(&nvshare_gpus[i].pool_bytes, 0);
        atomic_store(&nvshare_gpus[i].small_budget, 0);
        nvshare_gpus[i].n_pools = 0;
    }
}

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
    if (!g)
        return 0;
    /* Its exports go first: once freed, the address may be handed out again at once, and a new
     * allocation there must not be exported as the old one (an importer would map freed memory).
     * A free that fails then leaves the allocation unexported; opens already made keep working. */
    nvshare_ipc_forget(dptr);
    if (!nvshare_swap_free(g, dptr, rc))
        return 0;
    if (*rc == CUDA_SUCCESS)
        unrecord((uint64_t)dptr, KIND_PTR);
    return 1;
}

/* `after` runs when the driver freed it (not for swappable memory, which swap.c frees). */
#define FREE_SWAPPABLE_WRAPPER(name, params, call, after)                                        \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        CUresult rc;                                                                             \
        if (free_swappable(dptr, &rc))                                                           \
            return rc;                                                                           \
        nvshare_in_hook++;                                                                       \
        rc = nvshare_real.name call;                                                             \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS) {                                                                \
            unrecord((uint64_t)dptr, KIND_PTR);                                                  \
            after;                                                                               \
        }                                                                                        \
        return rc;                                                                               \
    }

FREE_WRAPPER(cuMemFree, (CUdeviceptr_v1 dptr), (dptr), dptr, KIND_PTR)
FREE_SWAPPABLE_WRAPPER(cuMemFree_v2, (CUdeviceptr dptr), (dptr), (void)0)


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
    ask_daemon(g, 1, 0, &reply, &answered);
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

/* ---- the app's own virtual memory: a handle counts until released and unmapped ------------ */
NVSHARE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                 unsigned long long flags)
{
    REAL_OR_FAIL(cuMemMap);
    nvshare_in_hook++;
    CUresult rc = nvshare_real.cuMemMap(ptr, size, offset, handle, flags);
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS || !nvshare_cfg.active || nvshare_in_hook)
        return rc;
    pthread_mutex_lock(&mem_mu);
    struct alloc *h = find(handle, KIND_HANDLE);
    if (h) {
        h->mapped++;
        struct nvshare_gpu *g = h->gpu;
        remember(ptr, KIND_MAP, 0, g);
        struct alloc *m = find(ptr, KIND_MAP);  /* remember() may have moved the table */
        if (m)
            m->handle = handle;
    }
    pthread_mutex_unlock(&mem_mu);
    return rc;
}

/* With mem_mu held: the handle entry stops counting when it is released and no longer mapped. */
static struct nvshare_gpu *settle_handle(struct alloc *h)
{
    if (!h || h->mapped > 0 || !h->released)
        return NULL;
    return forget(h->key, KIND_HANDLE);
}

NVSHARE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL_OR_FAIL(cuMemUnmap);
    nvshare_in_hook++;
    CUresult rc = nvshare_real.cuMemUnmap(ptr, size);
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS || !nvshare_cfg.active || nvshare_in_hook)
        return rc;
    pthread_mutex_lock(&mem_mu);
    struct nvshare_gpu *freed = NULL;
    struct alloc *m = find(ptr, KIND_MAP);
    if (m) {
        uint64_t handle = m->handle;
        forget(ptr, KIND_MAP);
        struct alloc *h = find(handle, KIND_HANDLE);
        if (h && h->mapped > 0)
            h->mapped--;
        freed = settle_handle(h);
    }
    pthread_mutex_unlock(&mem_mu);
    if (freed && atomic_load(&freed->mode) != GPU_PASS)
        nvshare_memory_report(freed);
    return rc;
}

NVSHARE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL_OR_FAIL(cuMemRelease);
    nvshare_in_hook++;
    CUresult rc = nvshare_real.cuMemRelease(handle);
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS || !nvshare_cfg.active || nvshare_in_hook)
        return rc;
    pthread_mutex_lock(&mem_mu);
    struct alloc *h = find(handle, KIND_HANDLE);
    if (h)
        h->released = 1;
    struct nvshare_gpu *freed = settle_handle(h);
    pthread_mutex_unlock(&mem_mu);
    if (freed && atomic_load(&freed->mode) != GPU_PASS)
        nvshare_memory_report(freed);
    return rc;
}

/* ---- stream-ordered allocations: pools hold what they reserved, freed or not ---------------- */
/* Policy: account, not bound. A pool's reserved memory (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) plus
 * graph memory nodes' reserve is reported as fixed memory on its GPU, sampled after every
 * stream-ordered allocation and free, pool call, and memory report. The pointers themselves are not
 * counted one by one, so memory a pool keeps after cuMemFreeAsync still shows. */
static void remember_pool(struct nvshare_gpu *g, CUmemoryPool pool)
{
    if (!g || !pool)
        return;
    pthread_mutex_lock(&mem_mu);
    int known = 0;
    for (int i = 0; i < g->n_pools; i++)
        known |= g->pools[i] == pool;
    if (!known && g->n_pools < NVSHARE_MAX_POOLS)
        g->pools[g->n_pools++] = pool;
    else if (!known)
        nvshare_log("gpu %s: more than %d memory pools; the rest are not accounted", g->uuid, NVSHARE_MAX_POOLS);
    pthread_mutex_unlock(&mem_mu);
}

static struct nvshare_gpu *forget_pool(CUmemoryPool pool)
{
    struct nvshare_gpu *found = NULL;
    pthread_mutex_lock(&mem_mu);
    int n = atomic_load(&nvshare_n_gpus);
    for (int k = 0; k < n; k++) {
        struct nvshare_gpu *g = &nvshare_gpus[k];
        for (int i = 0; i < g->n_pools; i++)
            if (g->pools[i] == pool) {
                g->pools[i] = g->pools[--g->n_pools];
                found = g;
                break;
            }
    }
    pthread_mutex_unlock(&mem_mu);
    return found;
}

static struct nvshare_gpu *gpu_of_pool(CUmemoryPool pool)
{
    struct nvshare_gpu *found = NULL;
    pthread_mutex_lock(&mem_mu);
    int n = atomic_load(&nvshare_n_gpus);
    for (int k = 0; k < n && !found; k++)
        for (int i = 0; i < nvshare_gpus[k].n_pools; i++)
            if (nvshare_gpus[k].pools[i] == pool)
                found = &nvshare_gpus[k];
    pthread_mutex_unlock(&mem_mu);
    return found;
}

static uint64_t pool_attribute(CUmemoryPool pool, int attr)
{
    cuuint64_t v = 0;
    if (!nvshare_real.cuMemPoolGetAttribute || nvshare_real.cuMemPoolGetAttribute(pool, attr, &v) != CUDA_SUCCESS)
        return 0;
    return v;
}

static uint64_t pool_reserved(struct nvshare_gpu *g)
{
    if (!g || !nvshare_real.cuMemPoolGetAttribute)
        return 0;
    nvshare_in_hook++;
    CUmemoryPool dflt = NULL;
    if (nvshare_real.cuDeviceGetDefaultMemPool &&
        nvshare_real.cuDeviceGetDefaultMemPool(&dflt, g->device) == CUDA_SUCCESS)
        remember_pool(g, dflt);
    CUmemoryPool pools[NVSHARE_MAX_POOLS];
    pthread_mutex_lock(&mem_mu);
    int n = g->n_pools;
    memcpy(pools, g->pools, sizeof pools[0] * (size_t)n);
    pthread_mutex_unlock(&mem_mu);
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += pool_attribute(pools[i], CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    cuuint64_t graph = 0;
    if (nvshare_real.cuDeviceGetGraphMemAttribute &&
        nvshare_real.cuDeviceGetGraphMemAttribute(g->device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &graph) ==
            CUDA_SUCCESS)
        total += graph;
    nvshare_in_hook--;
    return total;
}

/* Samples g's pools; reports when the figure moved. */
static void pools_changed(struct nvshare_gpu *g)
{
    if (!accounted(g))
        return;
    uint64_t now = pool_reserved(g);
    if (atomic_exchange(&g->pool_bytes, now) != now)
        nvshare_memory_report(g);
}

/* What the pool must still reserve for `bytes`: only that is asked of the daemon. */
static uint64_t pool_shortfall(struct nvshare_gpu *g, CUmemoryPool pool, uint64_t bytes)
{
    if (!pool && nvshare_real.cuDeviceGetMemPool) {
        nvshare_in_hook++;
        if (nvshare_real.cuDeviceGetMemPool(&pool, g->device) != CUDA_SUCCESS)
            pool = NULL;
        nvshare_in_hook--;
    }
    if (!pool)
        return bytes;
    remember_pool(g, pool);
    nvshare_in_hook++;
    uint64_t reserved = pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    uint64_t used = pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    nvshare_in_hook--;
    uint64_t spare = reserved > used ? reserved - used : 0;
    return bytes > spare ? bytes - spare : 0;
}

#define ASYNC_ALLOC_WRAPPER(name, params, call, pool)                                            \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *g = nvshare_gpu_for_current();                                       \
        if (accounted(g) && !nvshare_in_hook) {                                                  \
            CUresult admitted = admit(g, pool_shortfall(g, (pool), bytesize), 0, NULL);          \
            if (admitted != CUDA_SUCCESS)                                                        \
                return admitted;                                                                 \
        }                                                                                        \
        nvshare_in_hook++;                                                                       \
        CUresult rc = nvshare_real.name call;                                                    \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS && !nvshare_in_hook)                                              \
            pools_changed(g);                                                                    \
        return rc;                                                                               \
    }

ASYNC_ALLOC_WRAPPER(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream stream),
                    (dptr, bytesize, stream), NULL)
ASYNC_ALLOC_WRAPPER(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream stream),
                    (dptr, bytesize, stream), NULL)
ASYNC_ALLOC_WRAPPER(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream stream), (dptr, bytesize, pool, stream), pool)
ASYNC_ALLOC_WRAPPER(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                   CUstream stream), (dptr, bytesize, pool, stream), pool)

/* A stream-ordered free of a swappable allocation frees it at once: it waits for the device first.
 * Any other goes back to its pool, whose reserve is what counts (a cuMemAlloc freed this way too). */
#define POOL_SAMPLE() (nvshare_in_hook ? (void)0 : pools_changed(nvshare_gpu_for_current()))
FREE_SWAPPABLE_WRAPPER(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream), POOL_SAMPLE())
FREE_SWAPPABLE_WRAPPER(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream), POOL_SAMPLE())

NVSHARE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REAL_OR_FAIL(cuMemPoolCreate);
    CUresult rc = nvshare_real.cuMemPoolCreate(pool, props);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook && props &&
        props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        remember_pool(nvshare_gpu_for_device(props->location.id), *pool);
    return rc;
}

NVSHARE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL_OR_FAIL(cuMemPoolDestroy);
    CUresult rc = nvshare_real.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook)
        pools_changed(forget_pool(pool));
    return rc;
}

NVSHARE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    REAL_OR_FAIL(cuMemPoolTrimTo);
    CUresult rc = nvshare_real.cuMemPoolTrimTo(pool, keep);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook)
        pools_changed(gpu_of_pool(pool));
    return rc;
}

NVSHARE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    REAL_OR_FAIL(cuMemPoolSetAttribute);
    CUresult rc = nvshare_real.cuMemPoolSetAttribute(pool, attr, value);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook)
        pools_changed(gpu_of_pool(pool));
    return rc;
}

/* ---- the card's size as the job sees it --------------------------------------------------- */
/* cuMemGetInfo shows the job's limit as the total: so does cuDeviceTotalMem, or frameworks that
 * size caches from it (a fraction of the card) plan for memory the job may never take. */
NVSHARE_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL_OR_FAIL(cuDeviceTotalMem_v2);
    CUresult rc = nvshare_real.cuDeviceTotalMem_v2(bytes, dev);
    if (rc == CUDA_SUCCESS && bytes && nvshare_cfg.active && nvshare_cfg.mem_limit &&
        nvshare_cfg.mem_limit < *bytes)
        *bytes = (size_t)nvshare_cfg.mem_limit;
    return rc;
}

/* ---- swappable memory described as cuMemAlloc would describe it --------------------------- */
/* The driver sees chunks of 256 MiB mapped under one reservation; programs that ask for the range
 * of a pointer (allocator bookkeeping, NCCL registration) expect the whole allocation. */
NVSHARE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    REAL_OR_FAIL(cuMemGetAddressRange_v2);
    CUdeviceptr b;
    size_t n;
    if (nvshare_cfg.active && !nvshare_in_hook && nvshare_swap_range(ptr, &b, &n)) {
        if (base)
            *base = b;
        if (size)
            *size = n;
        return CUDA_SUCCESS;
    }
    return nvshare_real.cuMemGetAddressRange_v2(base, size, ptr);
}

/* With the driver's answer in *data: the range attributes of a swappable allocation corrected. */
static void describe_range(int attr, void *data, CUdeviceptr ptr)
{
    CUdeviceptr base;
    size_t size;
    if (!data || !nvshare_cfg.active || nvshare_in_hook ||
        (attr != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attr != CU_POINTER_ATTRIBUTE_RANGE_SIZE) ||
        !nvshare_swap_range(ptr, &base, &size))
        return;
    if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        *(CUdeviceptr *)data = base;
    else
        *(size_t *)data = size;
}

NVSHARE_EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr)
{
    REAL_OR_FAIL(cuPointerGetAttribute);
    CUresult rc = nvshare_real.cuPointerGetAttribute(data, attr, ptr);
    if (rc == CUDA_SUCCESS)
        describe_range(attr, data, ptr);
    return rc;
}

NVSHARE_EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr ptr)
{
    REAL_OR_FAIL(cuPointerGetAttributes);
    CUresult rc = nvshare_real.cuPointerGetAttributes(n, attrs, data, ptr);
    for (unsigned int i = 0; rc == CUDA_SUCCESS && attrs && data && i < n; i++)
        describe_range(attrs[i], data[i], ptr);
    return rc;
}

/* ---- CUDA IPC ------------------------------------------------------------------------------ */
/* The driver refuses legacy IPC on virtual-memory allocations, which swappable memory is: ipc.c
 * exports it itself (fixed on the GPU from then on) and opens such handles in the importer. */
static int driver_loaded(void)
{
    return atomic_load_explicit(&nvshare_driver_ok, memory_order_acquire) || nvshare_load_driver() == 0;
}

NVSHARE_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr)
{
    if (!driver_loaded())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr base;
    size_t size;
    struct nvshare_gpu *g = NULL;
    if (nvshare_cfg.active && !nvshare_in_hook && handle)
        g = nvshare_swap_range(ptr, &base, &size);
    if (g) {
        /* Inside the gate the allocation is resident; fixed, it stays so after the gate closes. */
        nvshare_gate_enter(g);
        uint64_t newly_fixed = 0;
        CUresult rc = nvshare_ipc_export(g, ptr, handle, &newly_fixed);
        nvshare_gate_leave(g);
        if (newly_fixed)
            nvshare_memory_report(g);
        if (rc != CUDA_ERROR_NOT_SUPPORTED)
            return rc;
        static atomic_int told;
        if (!atomic_exchange(&told, 1))
            nvshare_log("gpu %s: the driver cannot export swappable memory for CUDA IPC on this GPU; CUDA "
                        "IPC needs NVSHARE_SWAP=off for this job", g->uuid);
    }
    if (!nvshare_real.cuIpcGetMemHandle)
        return CUDA_ERROR_NOT_FOUND;
    return nvshare_real.cuIpcGetMemHandle(handle, ptr);
}

#define IPC_OPEN_WRAPPER(name)                                                                   \
    NVSHARE_EXPORT CUresult name(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)   \
    {                                                                                            \
        if (!driver_loaded())                                                                    \
            return CUDA_ERROR_NOT_INITIALIZED;                                                   \
        if (nvshare_ipc_is_ours(&handle))                                                        \
            return nvshare_ipc_open(dptr, &handle, flags);                                       \
        if (!nvshare_real.name)                                                                  \
            return CUDA_ERROR_NOT_FOUND;                                                         \
        return nvshare_real.name(dptr, handle, flags);                                           \
    }
IPC_OPEN_WRAPPER(cuIpcOpenMemHandle)
IPC_OPEN_WRAPPER(cuIpcOpenMemHandle_v2)

NVSHARE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    if (!driver_loaded())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc;
    if (nvshare_ipc_close(dptr, &rc))
        return rc;
    if (!nvshare_real.cuIpcCloseMemHandle)
        return CUDA_ERROR_NOT_FOUND;
    return nvshare_real.cuIpcCloseMemHandle(dptr);
}

/* ---- CUDA arrays: sized from their descriptor ----------------------------------------------- */
/* The driver does not say what an array takes (cuArrayGetMemoryRequirements answers only for
 * deferred-mapping arrays), so the hook counts elements x element size x channels, per mip level:
 * a lower bound, the driver's padding and tiling not included. */
static uint64_t element_bytes(int format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned int channels, unsigned int levels)
{
    uint64_t total = 0;
    for (unsigned int l = 0; l < (levels ? levels : 1); l++) {
        total += (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1) * element_bytes(format) * (channels ? channels : 1);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    return total;
}

#define ARRAY_CREATE_WRAPPER(name, params, call, handle_type, bytes_expr)                        \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *g = nvshare_gpu_for_current();                                       \
        uint64_t bytes = desc ? (bytes_expr) : 0;                                                \
        CUresult rc = admit(g, bytes, 0, NULL);                                                  \
        if (rc != CUDA_SUCCESS)                                                                  \
            return rc;                                                                           \
        nvshare_in_hook++;                                                                       \
        rc = nvshare_real.name call;                                                             \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS && array)                                                         \
            record(g, (uint64_t)(uintptr_t)*array, KIND_ARRAY, bytes);                           \
        return rc;                                                                               \
    }

ARRAY_CREATE_WRAPPER(cuArrayCreate_v2, (CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc), (array, desc),
                     CUarray, array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1))
ARRAY_CREATE_WRAPPER(cuArray3DCreate_v2, (CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc), (array, desc),
                     CUarray, array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1))
ARRAY_CREATE_WRAPPER(cuMipmappedArrayCreate, (CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                              unsigned int levels), (array, desc, levels), CUmipmappedArray,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, levels))
FREE_WRAPPER(cuArrayDestroy, (CUarray array), (array), (uintptr_t)array, KIND_ARRAY)
FREE_WRAPPER(cuMipmappedArrayDestroy, (CUmipmappedArray array), (array), (uintptr_t)array, KIND_ARRAY)
