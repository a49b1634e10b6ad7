/* gpus.c: which GPU a call is for. The GPUs this process uses, and its CUDA contexts.
 *
 * The calling thread's current context, cached per thread and in a table of (context -> GPU), so the
 * hot path is one cuCtxGetCurrent plus atomics. A GPU is identified by the UUID the driver reports,
 * so CUDA_VISIBLE_DEVICES may use indices or UUIDs. The gate, the memory accounting and swap all
 * look GPUs up here; this file calls none of them (only outbox.c and client.c, for the link).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "driver.h"
#include "env.h"
#include "gpus.h"
#include "outbox.h"

struct nvshare_gpu nvshare_gpus[NVSHARE_MAX_GPUS];
atomic_int nvshare_n_gpus;
static pthread_mutex_t gpus_mu = PTHREAD_MUTEX_INITIALIZER;

/* Until the daemon says otherwise (CLIENT_REGISTER_REPLY's idle_release_us). */
#define IDLE_DEFAULT_NS 2000000ull

/* ---- contexts ------------------------------------------------------------------------------- */
/* The table grows in blocks that never move, so the hot path reads it without a lock. */
#define CTX_BLOCK 256
#define CTX_BLOCKS 64                /* 16384 contexts */
struct ctx_entry {
    _Atomic(CUcontext) ctx;
    struct nvshare_gpu *gpu;
    int syncing;                     /* a drain has it pushed (under ctx_mu): destroy waits */
};
static struct ctx_entry *_Atomic ctx_blocks[CTX_BLOCKS];
static atomic_int ctx_count;
static atomic_uint ctx_generation;  /* bumped when a context is forgotten: per-thread caches retry */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;  /* insertions, and drains vs destroys */
static pthread_cond_t ctx_cv = PTHREAD_COND_INITIALIZER;    /* a drain let a context go */
static int ctx_full_logged;

static NVSHARE_TLS CUcontext tl_ctx;
static NVSHARE_TLS struct nvshare_gpu *tl_gpu;
static NVSHARE_TLS unsigned tl_generation;

static struct ctx_entry *ctx_at(int i)
{
    return &atomic_load(&ctx_blocks[i / CTX_BLOCK])[i % CTX_BLOCK];
}

static void format_uuid(char *out, const CUuuid *u)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, NVSHARE_UUID_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

void nvshare_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

struct nvshare_gpu *nvshare_gpu_by_uuid(const char *uuid)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++)
        if (strncmp(nvshare_gpus[i].uuid, uuid, NVSHARE_UUID_LEN) == 0)
            return &nvshare_gpus[i];
    return NULL;
}

static struct nvshare_gpu *gpu_slot(const char *uuid, CUdevice dev)
{
    struct nvshare_gpu *g = nvshare_gpu_by_uuid(uuid);
    if (g)
        return g;
    pthread_mutex_lock(&gpus_mu);
    g = nvshare_gpu_by_uuid(uuid);
    int n = atomic_load(&nvshare_n_gpus);
    if (!g && n < NVSHARE_MAX_GPUS) {
        g = &nvshare_gpus[n];
        memset(g->uuid, 0, sizeof g->uuid);
        nvshare_copy_str(g->uuid, NVSHARE_UUID_LEN, uuid);
        g->device = dev;
        /* Each part's starting state: the gate shut for a managed GPU until granted, no hand-over,
         * the daemon's idle threshold; swap does not know yet whether the GPU has VMM. */
        pthread_mutex_init(&g->gate.mu, NULL);
        nvshare_cond_init(&g->gate.waiters_cv);
        nvshare_cond_init(&g->gate.keeper_cv);
        nvshare_cond_init(&g->gate.drain_cv);
        g->gate.handoff_out_fd = g->gate.handoff_in_fd = -1;
        pthread_mutex_init(&g->swap.mu, NULL);
        g->swap.vmm = -1;
        pthread_mutex_init(&g->pace.mu, NULL);
        g->pace.last_done = -1;
        uint32_t us = nvshare_outbox_idle_release_us();
        g->gate.idle_threshold_ns = us ? (uint64_t)us * 1000 : IDLE_DEFAULT_NS;
        int managed = nvshare_cfg.active && nvshare_gpu_is_managed(uuid);
        atomic_store(&g->mode, managed ? GPU_UNKNOWN : GPU_PASS);
        atomic_store(&g->gate.open, managed ? (nvshare_outbox_refused() ? 1 : 0) : 1);
        if (managed && nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN && nvshare_outbox_daemon_gone())
            atomic_store(&g->gate.open, 1);
        atomic_store(&nvshare_n_gpus, n + 1);  /* publish after the slot is complete */
        if (!managed && nvshare_cfg.active)
            nvshare_debug("gpu %s: not in NVSHARE_MANAGED_GPUS; not gated", uuid);
    }
    pthread_mutex_unlock(&gpus_mu);
    return g;
}

struct nvshare_gpu *nvshare_gpu_for_device(CUdevice dev)
{
    CUuuid u;
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    nvshare_in_hook++;
    if (nvshare_real.cuDeviceGetUuid_v2)
        rc = nvshare_real.cuDeviceGetUuid_v2(&u, dev);
    if (rc != CUDA_SUCCESS && nvshare_real.cuDeviceGetUuid)
        rc = nvshare_real.cuDeviceGetUuid(&u, dev);
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS)
        return NULL;
    char uuid[NVSHARE_UUID_LEN];
    format_uuid(uuid, &u);
    return gpu_slot(uuid, dev);
}

static struct nvshare_gpu *ctx_lookup(CUcontext ctx)
{
    int n = atomic_load(&ctx_count);
    for (int i = 0; i < n; i++)
        if (atomic_load(&ctx_at(i)->ctx) == ctx)
            return ctx_at(i)->gpu;
    return NULL;
}

static struct nvshare_gpu *ctx_insert(CUcontext ctx, struct nvshare_gpu *g)
{
    pthread_mutex_lock(&ctx_mu);
    struct nvshare_gpu *known = ctx_lookup(ctx);
    if (!known) {
        int n = atomic_load(&ctx_count);
        int slot = -1;
        for (int i = 0; i < n; i++)  /* reuse a forgotten entry */
            if (atomic_load(&ctx_at(i)->ctx) == NULL && !ctx_at(i)->syncing) {
                slot = i;
                break;
            }
        if (slot < 0 && n < CTX_BLOCK * CTX_BLOCKS) {
            if (!atomic_load(&ctx_blocks[n / CTX_BLOCK])) {
                struct ctx_entry *block = calloc(CTX_BLOCK, sizeof *block);
                if (block)
                    atomic_store(&ctx_blocks[n / CTX_BLOCK], block);
            }
            if (atomic_load(&ctx_blocks[n / CTX_BLOCK]))
                slot = n;
        }
        if (slot >= 0) {
            ctx_at(slot)->gpu = g;
            atomic_store(&ctx_at(slot)->ctx, ctx);
            if (slot == n)
                atomic_store(&ctx_count, n + 1);
        } else if (!ctx_full_logged) {
            ctx_full_logged = 1;
            nvshare_log("gpu %s: more than %d live CUDA contexts; work in the newest is not drained at hand-over",
                        g->uuid, CTX_BLOCK * CTX_BLOCKS);
        }
        known = g;
    }
    pthread_mutex_unlock(&ctx_mu);
    return known;
}

void nvshare_ctx_remember(CUcontext ctx, CUdevice dev)
{
    if (!nvshare_cfg.active || !ctx)
        return;
    struct nvshare_gpu *g = nvshare_gpu_for_device(dev);
    if (g)
        ctx_insert(ctx, g);
}

void nvshare_ctx_forget(CUcontext ctx)
{
    if (!ctx)
        return;
    pthread_mutex_lock(&ctx_mu);
    int n = atomic_load(&ctx_count);
    for (int i = 0; i < n; i++)
        if (atomic_load(&ctx_at(i)->ctx) == ctx) {
            while (ctx_at(i)->syncing)  /* a drain has it pushed: let it pop first */
                pthread_cond_wait(&ctx_cv, &ctx_mu);
            atomic_store(&ctx_at(i)->ctx, NULL);
        }
    atomic_fetch_add(&ctx_generation, 1);
    pthread_mutex_unlock(&ctx_mu);
}

CUcontext nvshare_ctx_for_gpu(struct nvshare_gpu *g)
{
    CUcontext found = NULL;
    pthread_mutex_lock(&ctx_mu);
    int n = atomic_load(&ctx_count);
    for (int i = 0; i < n && !found; i++)
        if (ctx_at(i)->gpu == g)
            found = atomic_load(&ctx_at(i)->ctx);
    pthread_mutex_unlock(&ctx_mu);
    return found;
}

void nvshare_primary_ctx_retained(CUdevice dev, CUcontext ctx)
{
    struct nvshare_gpu *g = nvshare_cfg.active ? nvshare_gpu_for_device(dev) : NULL;
    if (!g || !ctx)
        return;
    ctx_insert(ctx, g);
    g->primary = ctx;
}

/* cudaDeviceReset, or a release that may be the last: the driver may destroy the primary context.
 * Returns the context forgotten (NULL when none was known). */
CUcontext nvshare_primary_ctx_gone(CUdevice dev)
{
    struct nvshare_gpu *g = nvshare_cfg.active ? nvshare_gpu_for_device(dev) : NULL;
    CUcontext primary = g ? g->primary : NULL;
    if (primary) {
        nvshare_ctx_forget(primary);
        g->primary = NULL;
    }
    return primary;
}

struct nvshare_gpu *nvshare_gpu_for_current(void)
{
    if (!nvshare_cfg.active || nvshare_in_hook)
        return NULL;
    CUcontext ctx = NULL;
    if (nvshare_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;  /* no context: the driver will refuse the call itself */
    unsigned gen = atomic_load_explicit(&ctx_generation, memory_order_acquire);
    if (ctx == tl_ctx && gen == tl_generation)
        return tl_gpu;
    struct nvshare_gpu *g = ctx_lookup(ctx);
    if (!g) {
        CUdevice dev;
        nvshare_in_hook++;
        CUresult rc = nvshare_real.cuCtxGetDevice(&dev);
        nvshare_in_hook--;
        if (rc != CUDA_SUCCESS)
            return NULL;
        g = nvshare_gpu_for_device(dev);
        if (!g)
            return NULL;
        g = ctx_insert(ctx, g);
        nvshare_client_start();  /* with 'run' and no daemon the gate is open: connect anyway */
    }
    tl_ctx = ctx;
    tl_gpu = g;
    tl_generation = gen;
    return g;
}

/* The GPU of a context that need not be current (a peer copy names two). */
struct nvshare_gpu *nvshare_gpu_for_ctx(CUcontext ctx)
{
    if (!nvshare_cfg.active || nvshare_in_hook || !ctx)
        return NULL;
    struct nvshare_gpu *g = ctx_lookup(ctx);
    if (g)
        return g;
    CUdevice dev;
    nvshare_in_hook++;
    CUresult rc = nvshare_real.cuCtxPushCurrent_v2(ctx);
    if (rc == CUDA_SUCCESS) {
        rc = nvshare_real.cuCtxGetDevice(&dev);
        CUcontext popped;
        nvshare_real.cuCtxPopCurrent_v2(&popped);
    }
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS || !(g = nvshare_gpu_for_device(dev)))
        return NULL;  /* not a context the driver knows: it refuses the copy itself */
    return ctx_insert(ctx, g);
}

/* Synchronises g's contexts one at a time. ctx_mu is not held across a synchronise, so another GPU's
 * drain, a lookup or a new context never waits for this one; a context being synchronised is marked,
 * and cuCtxDestroy waits for that mark to go. CUDA_SUCCESS only when every one finished cleanly. */
CUresult nvshare_gpus_sync_contexts(struct nvshare_gpu *g)
{
    CUresult result = CUDA_SUCCESS;
    nvshare_in_hook++;
    int n = atomic_load(&ctx_count);
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&ctx_mu);
        struct ctx_entry *e = ctx_at(i);
        CUcontext ctx = atomic_load(&e->ctx);
        if (!ctx || e->gpu != g || e->syncing) {
            pthread_mutex_unlock(&ctx_mu);
            continue;
        }
        e->syncing = 1;
        pthread_mutex_unlock(&ctx_mu);
        CUresult rc = nvshare_real.cuCtxPushCurrent_v2(ctx);
        if (rc == CUDA_SUCCESS) {
            rc = nvshare_real.cuCtxSynchronize();
            CUcontext popped;
            nvshare_real.cuCtxPopCurrent_v2(&popped);
        } else if (rc == CUDA_ERROR_INVALID_CONTEXT) {
            rc = CUDA_SUCCESS;  /* destroyed behind the hook's back (no wrapper saw it): no work left */
        }
        pthread_mutex_lock(&ctx_mu);
        e->syncing = 0;
        pthread_cond_broadcast(&ctx_cv);
        pthread_mutex_unlock(&ctx_mu);
        if (rc != CUDA_SUCCESS && result == CUDA_SUCCESS)
            result = rc;
    }
    nvshare_in_hook--;
    return result;
}

/* The child of fork has no thread but this one: no drain is running. */
void nvshare_gpus_after_fork(void)
{
    pthread_mutex_init(&gpus_mu, NULL);
    pthread_mutex_init(&ctx_mu, NULL);
    pthread_cond_init(&ctx_cv, NULL);
}
