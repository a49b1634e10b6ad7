/* gate.c: per-GPU lock state, the gate every GPU-bound call passes, and hand-over.
 *
 * Which GPU: the calling thread's current context, cached per thread and in a small table of
 * (context -> GPU), so the hot path is one cuCtxGetCurrent plus atomics. A GPU is identified by the
 * UUID the driver reports, so CUDA_VISIBLE_DEVICES may use indices or UUIDs.
 *
 * Each gated GPU has a keeper thread that gives the lock back: at once on DROP_LOCK, and on
 * LOCK_CONTENDED as soon as nothing entered the gate for the adaptive idle threshold. Giving back =
 * close the gate, wait for the threads inside to leave, synchronise this GPU's contexts, move the
 * bytes the daemon asked for to host memory (swap.c), send LOCK_RELEASED. The keeper also brings
 * swapped memory back after a grant before it opens the gate, and swaps out on PREPARE_SWAP_OUT
 * while the process does not hold the GPU. Lock order: swap_mu before mu.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nvshare_hook.h"

struct nvshare_gpu nvshare_gpus[NVSHARE_MAX_GPUS];
atomic_int nvshare_n_gpus;
static pthread_mutex_t gpus_mu = PTHREAD_MUTEX_INITIALIZER;

#define IDLE_MIN_NS 100000ull        /* 100 us */
/* Measured on the H100: with a 100 ms cap a job whose start-up made many quick re-requests kept a
 * 100 ms threshold for good and never gave the GPU up in its 91 ms pauses. A hand-over without swap
 * costs well under a millisecond, so erring towards giving back early is cheap. */
#define IDLE_MAX_NS 20000000ull      /* 20 ms */
#define IDLE_DEFAULT_NS 2000000ull   /* until the daemon says otherwise */

/* ---- contexts ------------------------------------------------------------------------------- */
#define MAX_CTX 256
struct ctx_entry {
    _Atomic(CUcontext) ctx;
    struct nvshare_gpu *gpu;
};
static struct ctx_entry ctx_table[MAX_CTX];
static atomic_int ctx_count;
static atomic_uint ctx_generation;  /* bumped when a context is forgotten: per-thread caches retry */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;  /* insertions, and syncs vs destroys */

static NVSHARE_TLS CUcontext tl_ctx;
static NVSHARE_TLS struct nvshare_gpu *tl_gpu;
static NVSHARE_TLS unsigned tl_generation;

static void format_uuid(char *out, const CUuuid *u)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, NVSHARE_UUID_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static void gpu_init_sync(struct nvshare_gpu *g)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->mu, NULL);
    pthread_mutex_init(&g->swap_mu, NULL);
    pthread_cond_init(&g->waiters_cv, &attr);
    pthread_cond_init(&g->keeper_cv, &attr);
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
        g->vmm = -1;
        gpu_init_sync(g);
        uint32_t us = nvshare_client_idle_release_us();
        g->idle_threshold_ns = us ? (uint64_t)us * 1000 : IDLE_DEFAULT_NS;
        int managed = nvshare_cfg.active && nvshare_gpu_is_managed(uuid);
        atomic_store(&g->mode, managed ? GPU_UNKNOWN : GPU_PASS);
        atomic_store(&g->open, managed ? (nvshare_client_refused() ? 1 : 0) : 1);
        if (managed && nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN && !nvshare_client_connected())
            atomic_store(&g->open, 1);
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
        if (atomic_load(&ctx_table[i].ctx) == ctx)
            return ctx_table[i].gpu;
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
            if (atomic_load(&ctx_table[i].ctx) == NULL) {
                slot = i;
                break;
            }
        if (slot < 0 && n < MAX_CTX)
            slot = n;
        if (slot >= 0) {
            ctx_table[slot].gpu = g;
            atomic_store(&ctx_table[slot].ctx, ctx);
            if (slot == n)
                atomic_store(&ctx_count, n + 1);
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
        if (atomic_load(&ctx_table[i].ctx) == ctx)
            atomic_store(&ctx_table[i].ctx, NULL);
    atomic_fetch_add(&ctx_generation, 1);
    pthread_mutex_unlock(&ctx_mu);
}

CUcontext nvshare_ctx_for_gpu(struct nvshare_gpu *g)
{
    CUcontext found = NULL;
    pthread_mutex_lock(&ctx_mu);
    int n = atomic_load(&ctx_count);
    for (int i = 0; i < n && !found; i++)
        if (ctx_table[i].gpu == g)
            found = atomic_load(&ctx_table[i].ctx);
    pthread_mutex_unlock(&ctx_mu);
    return found;
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
        nvshare_client_start();
    }
    tl_ctx = ctx;
    tl_gpu = g;
    tl_generation = gen;
    return g;
}

/* ---- waiting for the lock ------------------------------------------------------------------- */
static void adapt_threshold(struct nvshare_gpu *g, uint64_t now)
{
    if (!g->last_release_idle)
        return;
    g->last_release_idle = 0;
    uint64_t gap = now - g->last_release_ns;
    /* Asked again right after an early release: it was not idle, only between bursts. */
    if (gap < 2 * g->idle_threshold_ns + 1000000ull)
        g->idle_threshold_ns = g->idle_threshold_ns * 2 > IDLE_MAX_NS ? IDLE_MAX_NS : g->idle_threshold_ns * 2;
    else
        g->idle_threshold_ns = g->idle_threshold_ns * 3 / 4 < IDLE_MIN_NS ? IDLE_MIN_NS
                                                                          : g->idle_threshold_ns * 3 / 4;
}

/* Called with the gate found shut: ask for the lock if nobody has, then wait for the grant. */
void nvshare_gate_wait(struct nvshare_gpu *g)
{
    nvshare_client_start();
    pthread_mutex_lock(&g->mu);
    g->waiters++;
    while (!(atomic_load(&g->open) && !atomic_load(&g->closing))) {
        uint64_t now = nvshare_now_ns();
        if (!g->held && !g->requested && g->no_room_until > now) {
            /* Our memory did not fit back last time: give the others time before asking again. */
            struct timespec until = {(time_t)(g->no_room_until / 1000000000ull),
                                     (long)(g->no_room_until % 1000000000ull)};
            pthread_cond_timedwait(&g->waiters_cv, &g->mu, &until);
            continue;
        }
        if (!g->held && !g->requested && !atomic_load(&g->closing) && nvshare_client_connected()) {
            adapt_threshold(g, now);
            uint32_t seq;
            if (nvshare_send_gpu_event(NVSHARE_MSG_LOCK_REQUEST, g->uuid, 0, 0, &seq) == 0) {
                g->requested = 1;
                g->request_seq = seq;
                nvshare_debug("gpu %s: lock requested", g->uuid);
            }
        }
        pthread_cond_wait(&g->waiters_cv, &g->mu);
    }
    g->waiters--;
    pthread_mutex_unlock(&g->mu);
}

/* ---- giving the lock back ------------------------------------------------------------------- */
static void sync_contexts(struct nvshare_gpu *g)
{
    pthread_mutex_lock(&ctx_mu);
    nvshare_in_hook++;
    int n = atomic_load(&ctx_count);
    for (int i = 0; i < n; i++) {
        CUcontext ctx = atomic_load(&ctx_table[i].ctx);
        if (!ctx || ctx_table[i].gpu != g)
            continue;
        if (nvshare_real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
            nvshare_real.cuCtxSynchronize();
            CUcontext popped;
            nvshare_real.cuCtxPopCurrent_v2(&popped);
        }
    }
    nvshare_in_hook--;
    pthread_mutex_unlock(&ctx_mu);
}

static void drain(struct nvshare_gpu *g)
{
    struct timespec pause = {0, 20000};
    while (atomic_load(&g->inside) > 0)
        nanosleep(&pause, NULL);
    sync_contexts(g);
}

/* With g->mu held, the gate closing and g drained: moves `bytes` out; returns with mu held. */
static uint64_t swap_out_unlocked(struct nvshare_gpu *g, uint64_t bytes)
{
    if (!bytes)
        return 0;
    g->swap_busy = 1;
    pthread_mutex_unlock(&g->mu);
    nvshare_swap_lock(g);
    uint64_t moved = nvshare_swap_out(g, bytes);
    nvshare_swap_unlock(g);
    nvshare_send_mem_report(g);
    pthread_mutex_lock(&g->mu);
    g->swap_busy = 0;
    return moved;
}

/* With g->mu held; returns with it held. */
static void release_lock(struct nvshare_gpu *g, uint32_t how)
{
    atomic_store(&g->closing, 1);
    uint64_t want = g->swap_out_bytes;
    g->swap_out_bytes = 0;
    pthread_mutex_unlock(&g->mu);
    drain(g);
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->swap_abort, 0);  /* still holding: no grant can overtake this one */
    uint64_t moved = swap_out_unlocked(g, want);
    if (g->held) {
        g->held = 0;
        atomic_store(&g->open, 0);
        g->last_release_ns = nvshare_now_ns();
        g->last_release_idle = how == NVSHARE_RELEASE_IDLE;
        nvshare_send_gpu_event(NVSHARE_MSG_LOCK_RELEASED, g->uuid,
                               how | (moved ? NVSHARE_RELEASE_SWAPPED : 0), moved, NULL);
        nvshare_debug("gpu %s: lock released (%s, held %.1f ms, idle threshold %.2f ms, %.1f MiB swapped out)",
                      g->uuid, how == NVSHARE_RELEASE_IDLE ? "idle" : "dropped",
                      (g->last_release_ns - g->granted_ns) / 1e6, g->idle_threshold_ns / 1e6,
                      moved / 1048576.0);
    }
    g->contended = 0;
    g->drop_pending = 0;
    atomic_store(&g->closing, 0);
    pthread_cond_broadcast(&g->waiters_cv);
}

/* With g->mu held: may work pass the gate now (holding the lock, or ungated)? */
static int should_open(struct nvshare_gpu *g)
{
    return g->held || atomic_load(&g->mode) == GPU_PASS ||
           (nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN && !nvshare_client_connected());
}

static void ensure_keeper(struct nvshare_gpu *g);

/* With g->mu held: open the gate, unless memory must come back first (then the keeper opens it). */
static void open_gate(struct nvshare_gpu *g)
{
    struct nvshare_mem_numbers numbers;
    nvshare_mem_numbers(g, &numbers);
    if (numbers.swapped || g->swap_busy) {
        g->swap_in_pending = 1;
        ensure_keeper(g);
        pthread_cond_signal(&g->keeper_cv);
        return;
    }
    atomic_store(&g->open, 1);
    pthread_cond_broadcast(&g->waiters_cv);
}

/* With g->mu held (the keeper): bring swapped memory back, then open the gate if it may open. */
static void swap_in_and_open(struct nvshare_gpu *g)
{
    g->swap_in_pending = 0;
    g->swap_busy = 1;
    pthread_mutex_unlock(&g->mu);
    nvshare_swap_lock(g);
    int rc = nvshare_swap_in(g);
    /* Open under swap_mu: an allocation decides "born swapped" under it by looking at the gate. */
    pthread_mutex_lock(&g->mu);
    g->swap_busy = 0;
    if (rc == 0 && should_open(g)) {
        atomic_store(&g->open, 1);
        pthread_cond_broadcast(&g->waiters_cv);
    }
    nvshare_swap_unlock(g);
    nvshare_send_mem_report(g);
    if (rc == 0)
        return;
    g->no_room_until = nvshare_now_ns() + 250000000ull;
    if (g->held) {
        /* Let the others run and free room; the waiting threads ask again after no_room_until. */
        g->held = 0;
        g->contended = g->drop_pending = 0;
        g->swap_out_bytes = 0;
        nvshare_send_gpu_event(NVSHARE_MSG_LOCK_RELEASED, g->uuid, NVSHARE_RELEASE_NO_ROOM, 0, NULL);
        pthread_cond_broadcast(&g->waiters_cv);
    } else if (should_open(g)) {
        g->swap_in_pending = 1;  /* ungated: keep trying */
    }
}

/* With g->mu held, not holding the lock: PREPARE_SWAP_OUT. */
static void swap_out_now(struct nvshare_gpu *g)
{
    uint64_t want = g->swap_now_bytes;
    g->swap_now_bytes = 0;
    if (atomic_load(&g->open) || g->held) {
        /* Ungated work may run at any moment: its memory cannot move. Say so in the numbers. */
        nvshare_send_mem_report(g);
        return;
    }
    atomic_store(&g->closing, 1);
    pthread_mutex_unlock(&g->mu);
    drain(g);
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->swap_abort, 0);
    uint64_t moved = g->held ? 0 : swap_out_unlocked(g, want);
    atomic_store(&g->closing, 0);
    pthread_cond_broadcast(&g->waiters_cv);
    if (!moved)
        nvshare_send_mem_report(g);
    nvshare_debug("gpu %s: asked to move %.1f MiB to host memory while waiting: moved %.1f MiB", g->uuid,
                  want / 1048576.0, moved / 1048576.0);
}

static void deadline_after(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += (uint64_t)ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000ull);
    ts->tv_nsec = (long)(ns % 1000000000ull);
}

static void *keeper_main(void *arg)
{
    struct nvshare_gpu *g = arg;
    nvshare_in_hook = 1;  /* driver calls of this thread are the hook's own */
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!(g->swap_in_pending || g->swap_now_bytes || (g->held && (g->drop_pending || g->contended))))
            pthread_cond_wait(&g->keeper_cv, &g->mu);
        if (g->swap_in_pending) {
            uint64_t now = nvshare_now_ns();
            if (!g->held && g->no_room_until > now) {
                struct timespec until;
                deadline_after(&until, g->no_room_until - now);
                pthread_cond_timedwait(&g->keeper_cv, &g->mu, &until);
                if (nvshare_now_ns() < g->no_room_until)
                    continue;
            }
            swap_in_and_open(g);
            continue;
        }
        if (g->swap_now_bytes) {
            swap_out_now(g);
            continue;
        }
        if (g->drop_pending) {
            release_lock(g, NVSHARE_RELEASE_DROPPED);
            continue;
        }
        /* Contended: give it back once nothing entered the gate for the idle threshold. */
        atomic_store(&g->touched, 0);
        struct timespec deadline;
        deadline_after(&deadline, g->idle_threshold_ns);
        int rc = 0;
        while (rc != ETIMEDOUT && g->held && g->contended && !g->drop_pending)
            rc = pthread_cond_timedwait(&g->keeper_cv, &g->mu, &deadline);
        if (!g->held || !g->contended || g->drop_pending)
            continue;
        if (!atomic_load(&g->touched) && atomic_load(&g->inside) == 0)
            release_lock(g, NVSHARE_RELEASE_IDLE);
    }
    return NULL;
}

static void ensure_keeper(struct nvshare_gpu *g)
{
    if (g->keeper_running)
        return;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (pthread_create(&g->keeper, &attr, keeper_main, g) == 0)
        g->keeper_running = 1;
    else
        nvshare_log("gpu %s: cannot start the hand-over thread; the lock is given back only on DROP_LOCK",
                    g->uuid);
    pthread_attr_destroy(&attr);
}

/* ---- daemon messages (client thread) -------------------------------------------------------- */
void nvshare_on_grant(struct nvshare_gpu *g, uint32_t flags, uint32_t switch_ms)
{
    pthread_mutex_lock(&g->mu);
    ensure_keeper(g);
    atomic_store(&g->mode, GPU_GATED);
    g->held = 1;
    g->requested = 0;
    g->contended = 0;
    g->drop_pending = 0;
    g->granted_ns = nvshare_now_ns();
    g->no_room_until = 0;
    /* A PREPARE_SWAP_OUT not yet done, or being done, is overtaken by the grant: moving memory
     * out only to bring it back would stall this job (measured: 11 s for 22 GiB, pinning first). */
    int unanswered_ask = g->swap_now_bytes != 0 && !g->swap_busy;
    g->swap_now_bytes = 0;
    if (g->swap_busy)
        atomic_store(&g->swap_abort, 1);
    open_gate(g);
    pthread_mutex_unlock(&g->mu);
    if (unanswered_ask)
        nvshare_send_mem_report(g);  /* the daemon takes the next report as the ask's answer */
    nvshare_debug("gpu %s: lock granted (%s, switch interval %u ms)", g->uuid,
                  flags == NVSHARE_GRANT_SHARED ? "shared" : "exclusive", switch_ms);
}

static void want_out(struct nvshare_gpu *g, uint64_t bytes)
{
    if (bytes > g->swap_out_bytes)
        g->swap_out_bytes = bytes;
}

void nvshare_on_contended(struct nvshare_gpu *g, uint64_t bytes)
{
    pthread_mutex_lock(&g->mu);
    if (g->held) {
        want_out(g, bytes);
        g->contended = 1;
        pthread_cond_signal(&g->keeper_cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void nvshare_on_drop(struct nvshare_gpu *g, uint32_t reason, uint64_t bytes)
{
    pthread_mutex_lock(&g->mu);
    if (g->held && reason == NVSHARE_DROP_TIMESLICE) {
        /* Others waited a whole interval and no pause was long enough: be quicker next time. */
        g->idle_threshold_ns = g->idle_threshold_ns / 2 < IDLE_MIN_NS ? IDLE_MIN_NS : g->idle_threshold_ns / 2;
    }
    if (g->held) {
        want_out(g, bytes);
        g->drop_pending = 1;
        pthread_cond_signal(&g->keeper_cv);
    }
    pthread_mutex_unlock(&g->mu);
    nvshare_debug("gpu %s: drop requested (reason %u, %.1f MiB to move out)", g->uuid, reason,
                  bytes / 1048576.0);
}

void nvshare_on_prepare_swap_out(struct nvshare_gpu *g, uint64_t bytes)
{
    pthread_mutex_lock(&g->mu);
    if (g->held) {
        want_out(g, bytes);  /* moved at the next release */
    } else if (bytes) {
        g->swap_now_bytes = bytes > g->swap_now_bytes ? bytes : g->swap_now_bytes;
        ensure_keeper(g);
        pthread_cond_signal(&g->keeper_cv);
    }
    pthread_mutex_unlock(&g->mu);
}

/* A REPLY to LOCK_REQUEST: this GPU is not the daemon's, or not this job's. Never block on it. */
void nvshare_on_request_refused(uint32_t seq, int32_t status, const char *message)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_lock(&g->mu);
        if (g->requested && g->request_seq == seq) {
            g->requested = 0;
            atomic_store(&g->mode, GPU_PASS);
            open_gate(g);
            pthread_mutex_unlock(&g->mu);
            if (status == NVSHARE_ERR_NOGPU)
                nvshare_debug("gpu %s: not managed for this job (%s); not gated", g->uuid, message);
            else
                nvshare_log("gpu %s: lock request refused (status %d: %s); not gated", g->uuid,
                            status, message);
            return;
        }
        pthread_mutex_unlock(&g->mu);
    }
}

/* Connection up: waiters ask again. Down: nobody holds anything; 'run' lets work pass meanwhile. */
void nvshare_on_connection_change(int connected)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_lock(&g->mu);
        if (atomic_load(&g->mode) != GPU_PASS) {
            g->held = 0;
            g->requested = 0;
            g->contended = 0;
            g->drop_pending = 0;
            g->swap_in_pending = 0;
            g->swap_out_bytes = 0;
            atomic_store(&g->open, 0);
            if (!connected && nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN)
                open_gate(g);
        }
        pthread_cond_broadcast(&g->waiters_cv);
        pthread_mutex_unlock(&g->mu);
    }
}

/* The daemon refused this process as a client: gating would only block the job. */
void nvshare_gates_open_all(const char *why)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_lock(&g->mu);
        atomic_store(&g->mode, GPU_PASS);
        open_gate(g);
        pthread_mutex_unlock(&g->mu);
    }
    (void)why;
}

/* The child of fork holds no lock and has no threads but this one. */
void nvshare_gate_after_fork(void)
{
    pthread_mutex_init(&gpus_mu, NULL);
    pthread_mutex_init(&ctx_mu, NULL);
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        gpu_init_sync(g);
        g->held = g->requested = g->waiters = g->contended = g->drop_pending = 0;
        g->swap_in_pending = g->swap_busy = 0;
        g->swap_out_bytes = g->swap_now_bytes = g->no_room_until = 0;
        g->keeper_running = 0;
        g->last_release_idle = 0;
        atomic_store(&g->inside, 0);
        atomic_store(&g->closing, 0);
        if (atomic_load(&g->mode) == GPU_GATED)
            atomic_store(&g->mode, GPU_UNKNOWN);
        int managed = nvshare_cfg.active && nvshare_gpu_is_managed(g->uuid);
        atomic_store(&g->mode, managed ? GPU_UNKNOWN : GPU_PASS);
        atomic_store(&g->open, managed ? (nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN) : 1);
    }
}
