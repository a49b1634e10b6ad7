/* hook.c: how calls reach libnvshare.so, and the generated wrappers of work that reaches the GPU.
 *
 * Three ways in, all answered from the one table of hook_symbols.h:
 *  - direct linking: the wrappers are exported, and LD_PRELOAD puts them before libcuda.so.1;
 *  - dlsym: overridden in both glibc versions; a CUDA name looked up in libcuda, RTLD_DEFAULT or
 *    RTLD_NEXT resolves to the wrapper (only when the driver has that name, so absence stays visible);
 *  - cuGetProcAddress(_v2): the driver picks the versioned entry point for (name, cudaVersion, flags);
 *    the hook finds which real function that is and hands back its wrapper.
 * The top layer: it calls the gate, bursts, GPU lookup and the driver's block, and its constructor
 * wires the rest together (the daemon's events to events.c, the fork handlers). Nothing calls it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "burst.h"
#include "client.h"
#include "demand.h"
#include "driver.h"
#include "env.h"
#include "events.h"
#include "gate.h"
#include "gpus.h"
#include "hold.h"
#include "ipc.h"
#include "memory.h"
#include "nvml.h"
#include "outbox.h"
#include "pace.h"
#include "swap.h"

/* ---- the table ------------------------------------------------------------------------------ */
#define NVSHARE_DECLARE(name, params, ...) NVSHARE_EXPORT CUresult name params;
NVSHARE_SYMBOLS(NVSHARE_DECLARE, NVSHARE_DECLARE)

struct hook_entry {
    const char *name;
    void *wrapper;
    void **real;
};

static const struct hook_entry hook_table[] = {
#define NVSHARE_ENTRY(name, ...) {#name, (void *)name, (void **)&nvshare_real.name},
    NVSHARE_SYMBOLS(NVSHARE_ENTRY, NVSHARE_ENTRY)
};
#define HOOK_COUNT (sizeof hook_table / sizeof hook_table[0])

static const struct hook_entry *entry_by_name(const char *name)
{
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (strcmp(hook_table[i].name, name) == 0)
            return &hook_table[i];
    return NULL;
}

/* ---- initialisation ------------------------------------------------------------------------- */
static void after_fork_child(void)
{
    nvshare_outbox_after_fork();
    nvshare_client_after_fork();
    nvshare_gpus_after_fork();
    nvshare_gate_after_fork();
    nvshare_memory_after_fork();
    nvshare_swap_after_fork();
    nvshare_ipc_after_fork();
    nvshare_demand_after_fork();
    nvshare_burst_after_fork();
    nvshare_pace_after_fork();
    nvshare_hold_after_fork();
}

__attribute__((constructor)) static void nvshare_init(void)
{
    nvshare_driver_prepare();
    nvshare_events_install();   /* client.c's reader hands what the daemon says to events.c */
    pthread_atfork(nvshare_memory_before_fork, nvshare_memory_parent_after_fork, after_fork_child);
}

/* ---- generated gate wrappers ---------------------------------------------------------------- */
#define NVSHARE_GATE_WRAPPER(name, params, args)                                                 \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *gate_gpu_ = nvshare_gate_enter(nvshare_gpu_for_current());           \
        nvshare_in_hook++; /* calls the driver makes to itself are not gated twice */            \
        CUresult gate_rc_ = nvshare_real.name args;                                              \
        nvshare_in_hook--;                                                                       \
        nvshare_gate_leave(gate_gpu_);                                                           \
        return gate_rc_;                                                                         \
    }
#define NVSHARE_NO_WRAPPER(name, params)
NVSHARE_SYMBOLS(NVSHARE_GATE_WRAPPER, NVSHARE_NO_WRAPPER)

/* ---- launches --------------------------------------------------------------------------------- */
/* Gated as above, and paced (pace.c): while co-runners' prompt bursts are about, a job that yields
 * to them keeps little work queued. Outside a graph capture only: an event recorded on a capturing
 * stream would become part of the graph. The wait counts as a synchronise: uncounted, a paced
 * bursty job's waits of a sample or more read as idle to demand.c, which cut its 28 ms bursts into
 * pieces short enough to pass for prompt ones (seen on the H200). `stream`: where the work goes. */
/* key: the launch's kernel at its grid and block (a graph: its executable), which pace.c remembers the
 * length of (nvshare_pace_shape); computed only for a launch held on the GPU. */
#define LAUNCH_WRAPPER(name, params, args, stream, key)                                      \
    NVSHARE_EXPORT CUresult name params                                                      \
    {                                                                                        \
        REAL_OR_FAIL(name);                                                                  \
        struct nvshare_gpu *pace_gpu_ = nvshare_gpu_for_current();                           \
        int paced_ = 0;                                                                      \
        if (pace_gpu_ && nvshare_pace_due(pace_gpu_) && !nvshare_gate_capturing(pace_gpu_)) { \
            nvshare_gate_sync_begin(pace_gpu_);   /* waiting for its own work: busy */       \
            paced_ = nvshare_pace_wait(pace_gpu_);                                           \
            nvshare_gate_sync_end(pace_gpu_);                                                \
        }                                                                                    \
        nvshare_tl_launch_held = paced_ == NVSHARE_PACE_HOLD; /* no host yield: the GPU holds it */ \
        struct nvshare_gpu *gate_gpu_ = nvshare_gate_enter(pace_gpu_);                       \
        nvshare_tl_launch_held = 0;                                                          \
        if (paced_ == NVSHARE_PACE_HOLD)                                                     \
            nvshare_pace_hold(pace_gpu_, stream, key);                                       \
        nvshare_in_hook++;                                                                   \
        CUresult rc_ = nvshare_real.name args;                                               \
        nvshare_in_hook--;                                                                   \
        if (paced_ && rc_ == CUDA_SUCCESS)                                                   \
            nvshare_pace_launched(pace_gpu_, stream);                                        \
        nvshare_gate_leave(gate_gpu_);                                                       \
        return rc_;                                                                          \
    }
/* A _ptsz entry point's NULL stream is the calling thread's own. */
#define PT_STREAM(s) ((s) ? (s) : CU_STREAM_PER_THREAD)
#define KERNEL_KEY nvshare_pace_shape_key((uintptr_t)a, (uint64_t)b * c * d, (uint64_t)e * f * g)
#define EX_KEY (a ? nvshare_pace_shape_key((uintptr_t)b, (uint64_t)a->gridDimX * a->gridDimY * a->gridDimZ,  \
                                           (uint64_t)a->blockDimX * a->blockDimY * a->blockDimZ) : 0)
LAUNCH_WRAPPER(cuLaunchKernel, NVP_LAUNCH, NVA_11, i, KERNEL_KEY)
LAUNCH_WRAPPER(cuLaunchKernel_ptsz, NVP_LAUNCH, NVA_11, PT_STREAM(i), KERNEL_KEY)
LAUNCH_WRAPPER(cuLaunchKernelEx, NVP_LAUNCH_EX, NVA_4, a ? a->hStream : NULL, EX_KEY)
LAUNCH_WRAPPER(cuLaunchKernelEx_ptsz, NVP_LAUNCH_EX, NVA_4, PT_STREAM(a ? a->hStream : NULL), EX_KEY)
LAUNCH_WRAPPER(cuLaunchCooperativeKernel, NVP_LAUNCH_COOP, NVA_10, i, KERNEL_KEY)
LAUNCH_WRAPPER(cuLaunchCooperativeKernel_ptsz, NVP_LAUNCH_COOP, NVA_10, PT_STREAM(i), KERNEL_KEY)
LAUNCH_WRAPPER(cuGraphLaunch, NVP_GRAPH, NVA_2, b, (uintptr_t)a)
LAUNCH_WRAPPER(cuGraphLaunch_ptsz, NVP_GRAPH, NVA_2, PT_STREAM(b), (uintptr_t)a)

/* ---- copies and sets into a stream -------------------------------------------------------------- */
/* Gated as above. Where a launch would be held on the GPU (pace.c's nvshare_pace_copy_held), a copy or
 * set into a stream goes behind a wait of its own there and does not wait on the host for a prompt
 * burst: a training's step begins and ends with one (its batch in, its loss out), and a host that
 * waited there queued nothing for the leaks (issue 42). Elsewhere it waits on the host as before. */
#define STREAM_WORK_WRAPPER(name, params, args, stream)                                     \
    NVSHARE_EXPORT CUresult name params                                                      \
    {                                                                                        \
        REAL_OR_FAIL(name);                                                                  \
        struct nvshare_gpu *work_gpu_ = nvshare_gpu_for_current();                           \
        int held_ = work_gpu_ && nvshare_pace_due(work_gpu_) &&                              \
                    !nvshare_gate_capturing(work_gpu_) && nvshare_pace_copy_held(work_gpu_); \
        nvshare_tl_launch_held = held_;                                                      \
        struct nvshare_gpu *gate_gpu_ = nvshare_gate_enter(work_gpu_);                       \
        nvshare_tl_launch_held = 0;                                                          \
        if (held_)                                                                           \
            nvshare_pace_hold_copy(work_gpu_, stream);                                       \
        nvshare_in_hook++;                                                                   \
        CUresult rc_ = nvshare_real.name args;                                               \
        nvshare_in_hook--;                                                                   \
        nvshare_gate_leave(gate_gpu_);                                                       \
        return rc_;                                                                          \
    }
STREAM_WORK_WRAPPER(cuMemcpyAsync, NVP_DTOD_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemcpyAsync_ptsz, NVP_DTOD_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemcpyHtoDAsync_v2, NVP_HTOD_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemcpyHtoDAsync_v2_ptsz, NVP_HTOD_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemcpyDtoHAsync_v2, NVP_DTOH_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemcpyDtoHAsync_v2_ptsz, NVP_DTOH_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemcpyDtoDAsync_v2, NVP_DTOD_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemcpyDtoDAsync_v2_ptsz, NVP_DTOD_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemcpy2DAsync_v2, NVP_2D_A, NVA_2, b)
STREAM_WORK_WRAPPER(cuMemcpy2DAsync_v2_ptsz, NVP_2D_A, NVA_2, PT_STREAM(b))
STREAM_WORK_WRAPPER(cuMemcpy3DAsync_v2, NVP_3D_A, NVA_2, b)
STREAM_WORK_WRAPPER(cuMemcpy3DAsync_v2_ptsz, NVP_3D_A, NVA_2, PT_STREAM(b))
STREAM_WORK_WRAPPER(cuMemsetD8Async, NVP_SET8_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemsetD8Async_ptsz, NVP_SET8_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemsetD16Async, NVP_SET16_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemsetD16Async_ptsz, NVP_SET16_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemsetD32Async, NVP_SET32_A, NVA_4, d)
STREAM_WORK_WRAPPER(cuMemsetD32Async_ptsz, NVP_SET32_A, NVA_4, PT_STREAM(d))
STREAM_WORK_WRAPPER(cuMemsetD2D8Async, NVP_SET2D8_A, NVA_6, f)
STREAM_WORK_WRAPPER(cuMemsetD2D8Async_ptsz, NVP_SET2D8_A, NVA_6, PT_STREAM(f))
STREAM_WORK_WRAPPER(cuMemsetD2D16Async, NVP_SET2D16_A, NVA_6, f)
STREAM_WORK_WRAPPER(cuMemsetD2D16Async_ptsz, NVP_SET2D16_A, NVA_6, PT_STREAM(f))
STREAM_WORK_WRAPPER(cuMemsetD2D32Async, NVP_SET2D32_A, NVA_6, f)
STREAM_WORK_WRAPPER(cuMemsetD2D32Async_ptsz, NVP_SET2D32_A, NVA_6, PT_STREAM(f))

/* ---- peer copies ------------------------------------------------------------------------------ */
/* A peer copy reads one GPU's memory and writes another's, whichever context is current: it runs
 * inside both GPUs' gates, so neither side's memory is swapped out or in another job's turn. The
 * gates are entered in slot order, so two threads copying in opposite directions never each hold
 * one while waiting for the other; entering holds no mutex, only the gate's `inside` count. */
static void enter_pair(struct nvshare_gpu *a, struct nvshare_gpu *b, struct nvshare_gpu **first,
                       struct nvshare_gpu **second)
{
    if (!a && !b)  /* host or array on both sides: the current context's GPU, as other copies */
        a = nvshare_gpu_for_current();
    if (a == b || !b)
        b = NULL;
    if (!a) {
        a = b;
        b = NULL;
    }
    if (a && b && b < a) {
        struct nvshare_gpu *t = a;
        a = b;
        b = t;
    }
    *first = nvshare_gate_enter(a);
    *second = nvshare_gate_enter(b);
}

/* gpu_a, gpu_b: the two sides' GPUs, as expressions over the wrapper's parameters. */
#define PAIR_COPY_WRAPPER(name, params, args, gpu_a, gpu_b)                                      \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *first, *second;                                                      \
        enter_pair(gpu_a, gpu_b, &first, &second);                                               \
        nvshare_in_hook++;                                                                       \
        CUresult rc = nvshare_real.name args;                                                    \
        nvshare_in_hook--;                                                                       \
        nvshare_gate_leave(second);                                                              \
        nvshare_gate_leave(first);                                                               \
        return rc;                                                                               \
    }
#define PEER_COPY_WRAPPER(name, params, args)                                                    \
    PAIR_COPY_WRAPPER(name, params, args, nvshare_gpu_for_ctx(b), nvshare_gpu_for_ctx(d))
PEER_COPY_WRAPPER(cuMemcpyPeer, NVP_PEER, NVA_5)
PEER_COPY_WRAPPER(cuMemcpyPeer_ptds, NVP_PEER, NVA_5)
PEER_COPY_WRAPPER(cuMemcpyPeerAsync, NVP_PEER_A, NVA_6)
PEER_COPY_WRAPPER(cuMemcpyPeerAsync_ptsz, NVP_PEER_A, NVA_6)

/* The 3D form names its contexts in the descriptor. The driver ignores an array side's context, so
 * it may be stale or garbage: it names no GPU to enter (arrays never leave their GPU). */
#define SIDE_GPU(type, ctx) ((type) == CU_MEMORYTYPE_ARRAY ? NULL : nvshare_gpu_for_ctx(ctx))
#define PEER_3D_WRAPPER(name, params, args)                                                      \
    PAIR_COPY_WRAPPER(name, params, args, a ? SIDE_GPU(a->dstMemoryType, a->dstContext) : NULL,  \
                      a ? SIDE_GPU(a->srcMemoryType, a->srcContext) : NULL)
PEER_3D_WRAPPER(cuMemcpy3DPeer, NVP_3DP, NVA_1)
PEER_3D_WRAPPER(cuMemcpy3DPeer_ptds, NVP_3DP, NVA_1)
PEER_3D_WRAPPER(cuMemcpy3DPeerAsync, NVP_3DP_A, NVA_2)
PEER_3D_WRAPPER(cuMemcpy3DPeerAsync_ptsz, NVP_3DP_A, NVA_2)

/* ---- initialisation and contexts ------------------------------------------------------------ */
NVSHARE_EXPORT CUresult cuInit(unsigned int flags)
{
    REAL_OR_FAIL(cuInit);
    CUresult rc = nvshare_real.cuInit(flags);
    if (rc == CUDA_SUCCESS)
        nvshare_client_start();  /* lazily: processes that never use CUDA never connect */
    return rc;
}

static CUresult remember_created(CUresult rc, CUcontext *pctx, CUdevice dev)
{
    if (rc == CUDA_SUCCESS && pctx && *pctx)
        nvshare_ctx_remember(*pctx, dev);
    return rc;
}

NVSHARE_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL_OR_FAIL(cuCtxCreate);
    return remember_created(nvshare_real.cuCtxCreate(pctx, flags, dev), pctx, dev);
}

NVSHARE_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL_OR_FAIL(cuCtxCreate_v2);
    return remember_created(nvshare_real.cuCtxCreate_v2(pctx, flags, dev), pctx, dev);
}

NVSHARE_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                                       unsigned int flags, CUdevice dev)
{
    REAL_OR_FAIL(cuCtxCreate_v3);
    return remember_created(nvshare_real.cuCtxCreate_v3(pctx, params, n, flags, dev), pctx, dev);
}

NVSHARE_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                       CUdevice dev)
{
    REAL_OR_FAIL(cuCtxCreate_v4);
    return remember_created(nvshare_real.cuCtxCreate_v4(pctx, params, flags, dev), pctx, dev);
}

/* Forget first: the keeper thread must not push a context that is being destroyed. */
NVSHARE_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    REAL_OR_FAIL(cuCtxDestroy);
    nvshare_ctx_forget(ctx);
    return nvshare_real.cuCtxDestroy(ctx);
}

NVSHARE_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REAL_OR_FAIL(cuCtxDestroy_v2);
    nvshare_ctx_forget(ctx);
    return nvshare_real.cuCtxDestroy_v2(ctx);
}

/* ---- green contexts: their streams' work lives in a context of their own, drained with the rest -- */
static CUcontext context_of_green(CUgreenCtx green)
{
    CUcontext ctx = NULL;
    if (!green || !nvshare_real.cuCtxFromGreenCtx)
        return NULL;
    nvshare_in_hook++;
    if (nvshare_real.cuCtxFromGreenCtx(&ctx, green) != CUDA_SUCCESS)
        ctx = NULL;
    nvshare_in_hook--;
    return ctx;
}

NVSHARE_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *green, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
    REAL_OR_FAIL(cuGreenCtxCreate);
    CUresult rc = nvshare_real.cuGreenCtxCreate(green, desc, dev, flags);
    if (rc == CUDA_SUCCESS && green && !nvshare_in_hook)
        nvshare_ctx_remember(context_of_green(*green), dev);
    return rc;
}

NVSHARE_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx green)
{
    REAL_OR_FAIL(cuGreenCtxDestroy);
    if (!nvshare_in_hook)
        nvshare_ctx_forget(context_of_green(green));
    return nvshare_real.cuGreenCtxDestroy(green);
}

/* ---- primary contexts: cudaDeviceReset must not leave the keeper a dead context to push -------- */
NVSHARE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    REAL_OR_FAIL(cuDevicePrimaryCtxRetain);
    CUresult rc = nvshare_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (rc == CUDA_SUCCESS && pctx && !nvshare_in_hook)
        nvshare_primary_ctx_retained(dev, *pctx);
    return rc;
}

/* Forget first, as cuCtxDestroy does (a drain must not push it while the driver destroys it). A
 * release that leaves the context alive (others still retain it) puts it back at once. */
#define PRIMARY_GONE_WRAPPER(name, may_survive)                                                  \
    NVSHARE_EXPORT CUresult name(CUdevice dev)                                                   \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        if (nvshare_in_hook)                                                                     \
            return nvshare_real.name(dev);                                                       \
        CUcontext primary = nvshare_primary_ctx_gone(dev);                                       \
        CUresult rc = nvshare_real.name(dev);                                                    \
        unsigned int flags;                                                                      \
        int active = 0;                                                                          \
        if ((may_survive) && primary && nvshare_real.cuDevicePrimaryCtxGetState &&               \
            nvshare_real.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&     \
            active)                                                                              \
            nvshare_primary_ctx_retained(dev, primary);                                          \
        return rc;                                                                               \
    }
PRIMARY_GONE_WRAPPER(cuDevicePrimaryCtxReset, 0)
PRIMARY_GONE_WRAPPER(cuDevicePrimaryCtxReset_v2, 0)
PRIMARY_GONE_WRAPPER(cuDevicePrimaryCtxRelease, 1)
PRIMARY_GONE_WRAPPER(cuDevicePrimaryCtxRelease_v2, 1)

/* Kernels of the current context may now reach peer's memory, past peer's gate: that memory must
 * never be swapped out from under them. */
NVSHARE_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    REAL_OR_FAIL(cuCtxEnablePeerAccess);
    CUresult rc = nvshare_real.cuCtxEnablePeerAccess(peer, flags);
    if ((rc == CUDA_SUCCESS || rc == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) && peer && nvshare_cfg.active &&
        !nvshare_in_hook) {
        CUdevice dev;
        nvshare_in_hook++;
        int known = nvshare_real.cuCtxPushCurrent_v2(peer) == CUDA_SUCCESS;
        if (known) {
            known = nvshare_real.cuCtxGetDevice(&dev) == CUDA_SUCCESS;
            CUcontext popped;
            nvshare_real.cuCtxPopCurrent_v2(&popped);
        }
        nvshare_in_hook--;
        struct nvshare_gpu *g = known ? nvshare_gpu_for_device(dev) : NULL;
        if (g && nvshare_swap_keep_resident(g))
            nvshare_debug("gpu %s: peer access enabled; its memory stays on the GPU from now on", g->uuid);
    }
    return rc;
}

/* ---- graph capture -------------------------------------------------------------------------- */
/* A capture begins inside the gate (so never during a drain) and is counted until it ends. */
#define BEGIN_CAPTURE_WRAPPER(name, params, call)                                                \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *gate_gpu_ = nvshare_gate_enter(nvshare_gpu_for_current());           \
        nvshare_in_hook++;                                                                       \
        CUresult rc = nvshare_real.name call;                                                    \
        nvshare_in_hook--;                                                                       \
        if (rc == CUDA_SUCCESS)                                                                  \
            nvshare_capture_began(gate_gpu_, stream);                                            \
        nvshare_gate_leave(gate_gpu_);                                                           \
        return rc;                                                                               \
    }
BEGIN_CAPTURE_WRAPPER(cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
BEGIN_CAPTURE_WRAPPER(cuStreamBeginCapture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
BEGIN_CAPTURE_WRAPPER(cuStreamBeginCaptureToGraph, (CUstream stream, CUgraph graph, const CUgraphNode *deps,
                      const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode),
                      (stream, graph, deps, edges, n, mode))
BEGIN_CAPTURE_WRAPPER(cuStreamBeginCaptureToGraph_ptsz, (CUstream stream, CUgraph graph, const CUgraphNode *deps,
                      const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode),
                      (stream, graph, deps, edges, n, mode))

/* Any answer but "wrong thread" ends the capture, an invalidated one included. */
#define END_CAPTURE_WRAPPER(name)                                                                \
    NVSHARE_EXPORT CUresult name(CUstream stream, CUgraph *graph)                                \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        CUresult rc = nvshare_real.name(stream, graph);                                          \
        if (rc != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)                                        \
            nvshare_capture_ended(stream);                                                       \
        return rc;                                                                               \
    }
END_CAPTURE_WRAPPER(cuStreamEndCapture)
END_CAPTURE_WRAPPER(cuStreamEndCapture_ptsz)

/* ---- synchronising calls: demand, never gated ------------------------------------------------ */
/* The GPU of the calling thread's context (a stream or event of another context is rare). */
#define COUNT_SYNC(name, call) COUNT_SYNC_ON(name, nvshare_gpu_for_current(), call)
#define COUNT_SYNC_ON(name, gpu, call)                                                           \
    do {                                                                                         \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *sync_gpu_ = (gpu);                                                   \
        if (sync_gpu_) {                                                                         \
            nvshare_gate_sync_begin(sync_gpu_);                                                  \
            nvshare_burst_syncing(sync_gpu_, 1);                                                 \
        }                                                                                        \
        CUresult sync_rc_ = call;                                                                \
        int sync_last_ = sync_gpu_ && nvshare_gate_sync_end(sync_gpu_);                          \
        if (sync_last_)                                                                          \
            nvshare_burst_syncing(sync_gpu_, 0);                                                 \
        if (sync_last_ && atomic_load_explicit(&sync_gpu_->burst.in_burst, memory_order_relaxed) && \
            atomic_load(&sync_gpu_->gate.inside) == 0)                                           \
            nvshare_burst_end(sync_gpu_); /* its work is done: a co-runner's burst may begin */  \
        return sync_rc_;                                                                         \
    } while (0)

NVSHARE_EXPORT CUresult cuCtxSynchronize(void)
{
    COUNT_SYNC(cuCtxSynchronize, nvshare_real.cuCtxSynchronize());
}

/* CUDA 13's cuGetProcAddress hands this out for cuCtxSynchronize (PyTorch's cudaDeviceSynchronize
 * on the H100): unwrapped, a torch job's synchronise counted as neither demand nor work in flight. */
NVSHARE_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    COUNT_SYNC_ON(cuCtxSynchronize_v2, ctx ? nvshare_gpu_for_ctx(ctx) : nvshare_gpu_for_current(),
                  nvshare_real.cuCtxSynchronize_v2(ctx));
}

NVSHARE_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    COUNT_SYNC(cuStreamSynchronize, nvshare_real.cuStreamSynchronize(stream));
}

NVSHARE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
    COUNT_SYNC(cuStreamSynchronize_ptsz, nvshare_real.cuStreamSynchronize_ptsz(stream));
}

NVSHARE_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    COUNT_SYNC(cuEventSynchronize, nvshare_real.cuEventSynchronize(event));
}

/* ---- cuGetProcAddress ----------------------------------------------------------------------- */
/* The wrapper of whatever real function the driver handed out, or the pointer itself when the
 * hook does not wrap it. Matching by address follows the driver's own choice of version and
 * per-thread-stream variant, so no version table has to be copied here. */
static void *wrap_proc(const char *symbol, void *fn)
{
    if (!fn)
        return fn;
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (*hook_table[i].real == fn)
            return hook_table[i].wrapper;
    if (symbol && entry_by_name(symbol))
        nvshare_debug("cuGetProcAddress(%s) returned a function nvshare does not know; not gated", symbol);
    return fn;
}

NVSHARE_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags)
{
    REAL_OR_FAIL(cuGetProcAddress);
    CUresult rc = nvshare_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn)
        *pfn = wrap_proc(symbol, *pfn);
    return rc;
}

NVSHARE_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    REAL_OR_FAIL(cuGetProcAddress_v2);
    CUresult rc = nvshare_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
    if (rc == CUDA_SUCCESS && pfn)
        *pfn = wrap_proc(symbol, *pfn);
    return rc;
}

/* ---- dlsym ---------------------------------------------------------------------------------- */
static int is_driver_handle(void *handle)
{
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return 1;
    void *driver_handle = nvshare_driver_handle();
    if (driver_handle && handle == driver_handle)
        return 1;
    /* The caller may have opened the driver before the hook did: same object, same handle. */
    void *loaded = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!loaded)
        return 0;
    dlclose(loaded);
    return loaded == handle;
}

static void *wrapper_for(void *handle, const char *name)
{
    if (name && name[0] == 'n' && strncmp(name, "nvml", 4) == 0 && !nvshare_in_hook)
        return nvshare_nvml_wrapper(handle, name);
    if (!name || name[0] != 'c' || name[1] != 'u' || nvshare_in_hook)
        return NULL;
    const struct hook_entry *e = entry_by_name(name);
    if (!e || !is_driver_handle(handle))
        return NULL;
    if (nvshare_load_driver() != 0 || !*e->real)
        return NULL;  /* the driver lacks it: let the real dlsym say so */
    return e->wrapper;
}

/* dlsym, in both glibc versions (below). The real one is reached by a tail call, so glibc still
 * sees the caller's return address, which RTLD_NEXT depends on: inlined into each version, whose
 * code stays `jmp *real_dlsym` at the end. */
static inline __attribute__((always_inline, optimize("optimize-sibling-calls"))) void *
hook_dlsym(void *handle, const char *name)
{
    if (!nvshare_real_dlsym)
        nvshare_driver_prepare();
    void *w = wrapper_for(handle, name);
    if (w)
        return w;
    return nvshare_real_dlsym(handle, name);
}

NVSHARE_EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *nvshare_dlsym_new(void *handle, const char *name)
{
    return hook_dlsym(handle, name);
}

NVSHARE_EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *nvshare_dlsym_old(void *handle, const char *name)
{
    return hook_dlsym(handle, name);
}

__asm__(".symver nvshare_dlsym_new, dlsym@@GLIBC_2.34");
#if defined(__x86_64__)
__asm__(".symver nvshare_dlsym_old, dlsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver nvshare_dlsym_old, dlsym@GLIBC_2.17");
#endif
