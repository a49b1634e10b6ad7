/* memory.c: every device allocation of this process, per GPU, told to the daemon.
 *
 * The wrappers (hook_memory.c) call in here before and after the driver. Before an allocation the hook asks (MEM_UPDATE with request > 0) and waits for MEM_REPLY; a refusal
 * becomes CUDA_ERROR_OUT_OF_MEMORY without calling the driver. After it, and after every free, it
 * reports the new numbers (request = 0): resident bytes, the fixed part of them, and swapped bytes.
 * cuMemAlloc_v2 (what cudaMalloc becomes) is backed by swap.c when it can be, so that it can move to
 * host memory; everything else is fixed. cuMemGetInfo shows the job's view: the smaller of what the
 * driver says and what the daemon allows. When the driver has no room for what was admitted, the
 * hook tells the daemon and tries again until NVSHARE_OOM_WAIT_SEC (nvshare_memory_driver_oom).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "driver.h"
#include "env.h"
#include "gpus.h"
#include "memory.h"
#include "outbox.h"

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;

/* KIND_HANDLE: the app's own cuMemCreate. It holds GPU memory until released *and* unmapped, so a
 * handle released while mapped stays counted until its last KIND_MAP entry (key = address) goes. */
enum { KIND_PTR = NVSHARE_ALLOC_PTR, KIND_HANDLE = NVSHARE_ALLOC_HANDLE, KIND_MAP = NVSHARE_ALLOC_MAP,
       KIND_ARRAY = NVSHARE_ALLOC_ARRAY };
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
    g->mem.allocated += size;
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
    a->gpu->mem.allocated -= a->size;
    a->kind = -1;
    return a->gpu;
}

static uint64_t allocated_on(struct nvshare_gpu *g)
{
    pthread_mutex_lock(&mem_mu);
    uint64_t v = g->mem.allocated;
    pthread_mutex_unlock(&mem_mu);
    return v;
}

void nvshare_mem_numbers(struct nvshare_gpu *g, struct nvshare_mem_numbers *out)
{
    /* swappable and swapped belong to swap.c (atomics): a report may see one move half done. */
    uint64_t pools = atomic_load(&g->mem.pool_bytes);
    pthread_mutex_lock(&mem_mu);
    uint64_t in_swap = atomic_load(&g->swap.swapped);
    uint64_t swapped = in_swap < g->mem.allocated ? in_swap : g->mem.allocated;
    out->resident = g->mem.allocated - swapped + pools;
    uint64_t swappable = g->swap.blocked ? 0 : atomic_load(&g->swap.swappable);
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

static void report(struct nvshare_gpu *g, uint32_t flags)
{
    if (!nvshare_outbox_connected())
        return;
    if (atomic_load(&g->mode) != GPU_PASS)
        atomic_store(&g->mem.pool_bytes, pool_reserved(g));
    struct nvshare_mem_update m;
    fill_mem_update(&m, g, 0, flags);
    nvshare_outbox_mem_update(&m);
}

void nvshare_memory_report(struct nvshare_gpu *g) { report(g, 0); }
void nvshare_memory_report_moving(struct nvshare_gpu *g) { report(g, NVSHARE_MEM_MOVING); }

void nvshare_memory_report_prefetched(struct nvshare_gpu *g, int stopped)
{
    report(g, NVSHARE_MEM_PREFETCH_DONE | (stopped ? NVSHARE_MEM_PREFETCH_SHORT : 0));
}

uint64_t nvshare_memory_on_grant(struct nvshare_gpu *g, int answer_ask)
{
    struct nvshare_mem_numbers numbers;
    nvshare_mem_numbers(g, &numbers);
    if (answer_ask)
        report(g, 0);   /* the daemon takes the next report as the ask's answer */
    return numbers.swapped;
}

/* Asks before allocating: 0 = allowed (the reply in *reply when *answered), 1 = refused.
 * *not_managed: the daemon answered NOGPU. */
static int ask_daemon(struct nvshare_gpu *g, uint64_t request, uint32_t flags,
                      struct nvshare_mem_reply *reply, int *answered, int *not_managed)
{
    *answered = 0;
    nvshare_client_start();
    if (atomic_load(&g->mode) == GPU_PASS)
        return 0;
    struct nvshare_mem_update question;
    fill_mem_update(&question, g, request, flags);
    int32_t status = NVSHARE_OK;
    if (nvshare_outbox_ask(&question, &status, reply) != NVSHARE_ASK_ANSWERED)
        return 0;  /* no daemon: 'run' passes, a refused client runs unshared */
    if (status == NVSHARE_ERR_NOGPU) {
        /* Not this job's GPU as far as the daemon knows: the caller has the gate open for good (as
         * on a refused LOCK_REQUEST). */
        *not_managed = 1;
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
    uint64_t have = atomic_load(&g->mem.small_budget);
    while (have >= bytes)
        if (atomic_compare_exchange_weak(&g->mem.small_budget, &have, have - bytes))
            return 1;
    return 0;
}

static void set_small_budget(struct nvshare_gpu *g, int refused, const struct nvshare_mem_reply *reply,
                             uint64_t bytes)
{
    uint64_t left = nvshare_cfg.alloc_budget && !refused && reply->available > bytes
                  ? (reply->available - bytes) / 16 : 0;
    atomic_store(&g->mem.small_budget, left < SMALL_BUDGET_MAX ? left : SMALL_BUDGET_MAX);
}

int nvshare_memory_accounted(struct nvshare_gpu *g)
{
    return g && nvshare_cfg.active && atomic_load(&g->mode) != GPU_PASS;
}

CUresult nvshare_memory_admit(struct nvshare_gpu *g, uint64_t bytes, uint32_t flags, int *deferred,
                              int *not_managed)
{
    *not_managed = 0;
    if (deferred)
        *deferred = 0;
    if (!nvshare_memory_accounted(g) || bytes == 0)
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
    int refused = ask_daemon(g, bytes, flags, &reply, &answered, not_managed);
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

/* ---- the driver's out-of-memory after admission ------------------------------------------------
 * The daemon admitted an allocation and the driver had no room: memory the daemon does not count is
 * held (an ended process's, which the driver frees some time after the process ended; a process
 * outside nvshare). Out-of-memory is the policy's to decide, so the hook tells the daemon what the
 * driver said, waits for its answer (it may hold it until it sees room) and a back-off, and asks
 * the driver again, until NVSHARE_OOM_WAIT_SEC. Without a connection it only backs off. */
#define OOM_PAUSE_FIRST_NS 10000000ull    /* 10 ms, doubling */
#define OOM_PAUSE_MAX_NS 250000000ull

/* The driver's free memory on g now (the real cuMemGetInfo, in a context of g), or UINT64_MAX. */
static uint64_t driver_free(struct nvshare_gpu *g)
{
    if (!nvshare_real.cuMemGetInfo_v2)
        return UINT64_MAX;
    int current = nvshare_gpu_for_current() == g;
    CUcontext ctx = current ? NULL : nvshare_ctx_for_gpu(g);
    if (!current && !ctx)
        return UINT64_MAX;
    nvshare_in_hook++;
    size_t free_bytes = 0, total = 0;
    CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx || nvshare_real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
        rc = nvshare_real.cuMemGetInfo_v2(&free_bytes, &total);
        CUcontext popped;
        if (ctx)
            nvshare_real.cuCtxPopCurrent_v2(&popped);
    }
    nvshare_in_hook--;
    return rc == CUDA_SUCCESS ? free_bytes : UINT64_MAX;
}

static void mib_text(char *out, size_t size, uint64_t bytes)
{
    if (bytes == UINT64_MAX)
        snprintf(out, size, "an unknown amount");
    else
        snprintf(out, size, "%.1f MiB", bytes / 1048576.0);
}

static void sleep_until(uint64_t at_ns)
{
    uint64_t now = nvshare_now_ns();
    if (at_ns <= now)
        return;
    uint64_t ns = at_ns - now;
    struct timespec left = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
}

/* The one line the job's output gets when the app is handed the driver's out-of-memory after all. */
static void gave_up(struct nvshare_gpu *g, uint64_t bytes, const struct nvshare_oom_wait *w,
                    uint64_t free_now, const char *why)
{
    char available[48], free_text[48];
    if (w->answered)
        mib_text(available, sizeof available, w->available);
    else
        snprintf(available, sizeof available, "no answer");
    mib_text(free_text, sizeof free_text, free_now);
    nvshare_log("gpu %s: out of memory: asked for %.1f MiB; nvshare-scheduler counted %s available to this "
                "job; the driver had %s free; %s after %.1f s (NVSHARE_OOM_WAIT_SEC=%u): "
                "CUDA_ERROR_OUT_OF_MEMORY", g->uuid, bytes / 1048576.0, available, free_text, why,
                (nvshare_now_ns() - w->started_ns) / 1e9, nvshare_cfg.oom_wait_sec);
}

int nvshare_memory_driver_oom(struct nvshare_gpu *g, uint64_t bytes, CUresult rc,
                              struct nvshare_oom_wait *w)
{
    if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
        if (rc == CUDA_SUCCESS && w->started_ns)
            nvshare_log("gpu %s: the driver found room for the %.1f MiB after %.1f s (%u tries)", g->uuid,
                        bytes / 1048576.0, (nvshare_now_ns() - w->started_ns) / 1e9, w->tries + 1);
        return 0;
    }
    if (!nvshare_memory_accounted(g) || nvshare_in_hook || !bytes || !nvshare_cfg.oom_wait_sec)
        return 0;
    uint64_t now = nvshare_now_ns();
    uint64_t free_now = driver_free(g);
    if (!w->started_ns) {
        w->started_ns = now;
        w->pause_ns = OOM_PAUSE_FIRST_NS;
        /* The budget was cut from a view of memory the driver has just contradicted. */
        atomic_store(&g->mem.small_budget, 0);
        char free_text[48];
        mib_text(free_text, sizeof free_text, free_now);
        nvshare_log("gpu %s: the driver has no room for %.1f MiB (it has %s free) although nvshare admitted "
                    "it; waiting up to %u s for memory to be freed (NVSHARE_OOM_WAIT_SEC)", g->uuid,
                    bytes / 1048576.0, free_text, nvshare_cfg.oom_wait_sec);
    }
    uint64_t give_up = w->started_ns + (uint64_t)nvshare_cfg.oom_wait_sec * 1000000000ull;
    if (now >= give_up) {
        gave_up(g, bytes, w, free_now, "gave up");
        return 0;
    }
    if (nvshare_outbox_connected() && atomic_load(&g->mode) != GPU_PASS) {
        struct nvshare_mem_update question;
        fill_mem_update(&question, g, bytes, w->flags | NVSHARE_MEM_DRIVER_OOM);
        uint64_t mib = free_now == UINT64_MAX ? 0 : free_now >> 20;
        question.driver_free_mib = mib < UINT32_MAX ? (uint32_t)mib : UINT32_MAX;
        int32_t status = NVSHARE_OK;
        struct nvshare_mem_reply reply;
        if (nvshare_outbox_ask_until(&question, &status, &reply, give_up) == NVSHARE_ASK_ANSWERED) {
            if (status == NVSHARE_ERR_NOGPU)
                return 0;   /* not gated for this job after all: the driver's answer is the answer */
            w->answered = 1;
            w->available = reply.available;
            w->deferred = (reply.flags & NVSHARE_MEM_DEFERRED) != 0;
            if (status == NVSHARE_ERR_NOMEM) {
                gave_up(g, bytes, w, free_now, "refused by nvshare-scheduler");
                return 0;
            }
        }
    }
    /* What is left of the back-off after the answer: a held answer was the wait. */
    sleep_until(now + w->pause_ns < give_up ? now + w->pause_ns : give_up);
    w->pause_ns = w->pause_ns * 2 < OOM_PAUSE_MAX_NS ? w->pause_ns * 2 : OOM_PAUSE_MAX_NS;
    w->tries++;
    return 1;
}

static void record(struct nvshare_gpu *g, uint64_t key, int kind, uint64_t size)
{
    pthread_mutex_lock(&mem_mu);
    remember(key, kind, size, g);
    pthread_mutex_unlock(&mem_mu);
    if (nvshare_memory_accounted(g))
        nvshare_memory_report(g);
}

void nvshare_memory_record(struct nvshare_gpu *g, uint64_t key, int kind, uint64_t size)
{
    if (!nvshare_memory_accounted(g) || size == 0 || nvshare_in_hook)
        return;
    record(g, key, kind, size);
}

/* The table is also how a free finds swap.c's memory (the driver's cuMemFree knows no reservation),
 * so swappable memory is recorded whatever the GPU's mode: the daemon's refusal may have made the GPU
 * pass-through while the allocation was being made (it waited for the registration's answer). */
void nvshare_memory_record_swappable(struct nvshare_gpu *g, uint64_t key, uint64_t size)
{
    if (!g || !nvshare_cfg.active || size == 0)
        return;
    record(g, key, KIND_PTR, size);
}

void nvshare_memory_unrecord(uint64_t key, int kind)
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
        atomic_store(&g->mem.small_budget, 0);   /* a new daemon: its first answer sets it */
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
        nvshare_gpus[i].mem.allocated = 0;
        atomic_store(&nvshare_gpus[i].mem.pool_bytes, 0);
        atomic_store(&nvshare_gpus[i].mem.small_budget, 0);
        nvshare_gpus[i].mem.n_pools = 0;
    }
}

/* ---- the job's view ------------------------------------------------------------------------- */
void nvshare_memory_job_view(struct nvshare_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes,
                             int *not_managed)
{
    *not_managed = 0;
    if (!nvshare_memory_accounted(g))
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
    ask_daemon(g, 1, 0, &reply, &answered, not_managed);
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

/* ---- the app's own virtual memory: a handle counts until released and unmapped ------------ */
/* With mem_mu held: the handle entry stops counting when it is released and no longer mapped. */
static struct nvshare_gpu *settle_handle(struct alloc *h)
{
    if (!h || h->mapped > 0 || !h->released)
        return NULL;
    return forget(h->key, KIND_HANDLE);
}

void nvshare_memory_mapped(uint64_t ptr, uint64_t handle)
{
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
}

void nvshare_memory_unmapped(uint64_t ptr)
{
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
}

void nvshare_memory_released(uint64_t handle)
{
    pthread_mutex_lock(&mem_mu);
    struct alloc *h = find(handle, KIND_HANDLE);
    if (h)
        h->released = 1;
    struct nvshare_gpu *freed = settle_handle(h);
    pthread_mutex_unlock(&mem_mu);
    if (freed && atomic_load(&freed->mode) != GPU_PASS)
        nvshare_memory_report(freed);
}

struct nvshare_gpu *nvshare_memory_gpu_of(uint64_t key, int kind)
{
    pthread_mutex_lock(&mem_mu);
    struct alloc *a = find(key, kind);
    struct nvshare_gpu *g = a ? a->gpu : NULL;
    pthread_mutex_unlock(&mem_mu);
    return g;
}

/* ---- stream-ordered allocations: pools hold what they reserved, freed or not ---------------- */
/* Policy: account, not bound. A pool's reserved memory (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) plus
 * graph memory nodes' reserve is reported as fixed memory on its GPU, sampled after every
 * stream-ordered allocation and free, pool call, and memory report. The pointers themselves are not
 * counted one by one, so memory a pool keeps after cuMemFreeAsync still shows. */
void nvshare_memory_pool_seen(struct nvshare_gpu *g, CUmemoryPool pool)
{
    if (!g || !pool)
        return;
    pthread_mutex_lock(&mem_mu);
    int known = 0;
    for (int i = 0; i < g->mem.n_pools; i++)
        known |= g->mem.pools[i] == pool;
    if (!known && g->mem.n_pools < NVSHARE_MAX_POOLS)
        g->mem.pools[g->mem.n_pools++] = pool;
    else if (!known)
        nvshare_log("gpu %s: more than %d memory pools; the rest are not accounted", g->uuid, NVSHARE_MAX_POOLS);
    pthread_mutex_unlock(&mem_mu);
}

struct nvshare_gpu *nvshare_memory_pool_destroyed(CUmemoryPool pool)
{
    struct nvshare_gpu *found = NULL;
    pthread_mutex_lock(&mem_mu);
    int n = atomic_load(&nvshare_n_gpus);
    for (int k = 0; k < n; k++) {
        struct nvshare_gpu *g = &nvshare_gpus[k];
        for (int i = 0; i < g->mem.n_pools; i++)
            if (g->mem.pools[i] == pool) {
                g->mem.pools[i] = g->mem.pools[--g->mem.n_pools];
                found = g;
                break;
            }
    }
    pthread_mutex_unlock(&mem_mu);
    return found;
}

struct nvshare_gpu *nvshare_memory_gpu_of_pool(CUmemoryPool pool)
{
    struct nvshare_gpu *found = NULL;
    pthread_mutex_lock(&mem_mu);
    int n = atomic_load(&nvshare_n_gpus);
    for (int k = 0; k < n && !found; k++)
        for (int i = 0; i < nvshare_gpus[k].mem.n_pools; i++)
            if (nvshare_gpus[k].mem.pools[i] == pool)
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
        nvshare_memory_pool_seen(g, dflt);
    CUmemoryPool pools[NVSHARE_MAX_POOLS];
    pthread_mutex_lock(&mem_mu);
    int n = g->mem.n_pools;
    memcpy(pools, g->mem.pools, sizeof pools[0] * (size_t)n);
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
void nvshare_memory_pools_changed(struct nvshare_gpu *g)
{
    if (!nvshare_memory_accounted(g))
        return;
    uint64_t now = pool_reserved(g);
    if (atomic_exchange(&g->mem.pool_bytes, now) != now)
        nvshare_memory_report(g);
}

/* What the pool must still reserve for `bytes`: only that is asked of the daemon. */
uint64_t nvshare_memory_pool_shortfall(struct nvshare_gpu *g, CUmemoryPool pool, uint64_t bytes)
{
    if (!pool && nvshare_real.cuDeviceGetMemPool) {
        nvshare_in_hook++;
        if (nvshare_real.cuDeviceGetMemPool(&pool, g->device) != CUDA_SUCCESS)
            pool = NULL;
        nvshare_in_hook--;
    }
    if (!pool)
        return bytes;
    nvshare_memory_pool_seen(g, pool);
    nvshare_in_hook++;
    uint64_t reserved = pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    uint64_t used = pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    nvshare_in_hook--;
    uint64_t spare = reserved > used ? reserved - used : 0;
    return bytes > spare ? bytes - spare : 0;
}
