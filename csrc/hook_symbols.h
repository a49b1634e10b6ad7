/* hook_symbols.h: the one list of CUDA driver symbols that libnvshare.so interposes.
 *
 * NVSHARE_SYMBOLS(GATE, OWN) expands every entry once:
 *   GATE(name, (params), (args))  work that reaches the GPU: the wrapper is generated (hook.c) and runs
 *                                 the real function inside the gate of the calling context's GPU.
 *   OWN(name, (params))           a hand-written wrapper (accounting, context bookkeeping, lookup,
 *                                 launches that pace.c keeps short behind prompt bursts,
 *                                 copies and sets into a stream that the GPU may hold as launches,
 *                                 peer copies that enter two GPUs' gates).
 * From this list come the real-function pointers, the exported wrappers, the name table that dlsym and
 * cuGetProcAddress consult, and (in tests/c) the list a test compares with `nm -D` of the library.
 * Every exported versioned name is listed separately: _v2/_v3 are distinct ABIs, and _ptds/_ptsz are
 * the per-thread default stream entry points that cuGetProcAddress hands out.
 */
#ifndef NVSHARE_HOOK_SYMBOLS_H
#define NVSHARE_HOOK_SYMBOLS_H

#include "cuda_subset.h"

/* Shared parameter lists. */
#define NVP_HTOD (CUdeviceptr a, const void *b, size_t c)
#define NVP_DTOH (void *a, CUdeviceptr b, size_t c)
#define NVP_DTOD (CUdeviceptr a, CUdeviceptr b, size_t c)
#define NVA_3 (a, b, c)
#define NVP_HTOD_A (CUdeviceptr a, const void *b, size_t c, CUstream d)
#define NVP_DTOH_A (void *a, CUdeviceptr b, size_t c, CUstream d)
#define NVP_DTOD_A (CUdeviceptr a, CUdeviceptr b, size_t c, CUstream d)
#define NVA_4 (a, b, c, d)
#define NVP_PEER (CUdeviceptr a, CUcontext b, CUdeviceptr c, CUcontext d, size_t e)
#define NVP_PEER_A (CUdeviceptr a, CUcontext b, CUdeviceptr c, CUcontext d, size_t e, CUstream f)
#define NVA_5 (a, b, c, d, e)
#define NVA_6 (a, b, c, d, e, f)
#define NVP_DTOA (CUarray a, size_t b, CUdeviceptr c, size_t d)
#define NVP_ATOD (CUdeviceptr a, CUarray b, size_t c, size_t d)
#define NVP_HTOA (CUarray a, size_t b, const void *c, size_t d)
#define NVP_ATOH (void *a, CUarray b, size_t c, size_t d)
#define NVP_ATOA (CUarray a, size_t b, CUarray c, size_t d, size_t e)
#define NVP_HTOA_A (CUarray a, size_t b, const void *c, size_t d, CUstream e)
#define NVP_ATOH_A (void *a, CUarray b, size_t c, size_t d, CUstream e)
#define NVP_2D (const CUDA_MEMCPY2D *a)
#define NVP_2D_A (const CUDA_MEMCPY2D *a, CUstream b)
#define NVP_3D (const CUDA_MEMCPY3D *a)
#define NVP_3D_A (const CUDA_MEMCPY3D *a, CUstream b)
#define NVP_3DP (const CUDA_MEMCPY3D_PEER *a)
#define NVP_3DP_A (const CUDA_MEMCPY3D_PEER *a, CUstream b)
#define NVA_1 (a)
#define NVA_2 (a, b)
#define NVP_BATCH_A (CUdeviceptr *a, CUdeviceptr *b, size_t *c, size_t d, CUmemcpyAttributes *e, \
                     size_t *f, size_t g, size_t *h, CUstream i)
#define NVA_9 (a, b, c, d, e, f, g, h, i)
#define NVP_BATCH3D_A (size_t a, CUDA_MEMCPY3D_BATCH_OP *b, size_t *c, unsigned long long d, CUstream e)
/* CUDA 13: the batch copies lost their failure index (_v2), and UVM gained batched prefetch/discard. */
#define NVP_BATCH_A2 (CUdeviceptr *a, CUdeviceptr *b, size_t *c, size_t d, CUmemcpyAttributes *e, \
                      size_t *f, size_t g, CUstream h)
#define NVA_8 (a, b, c, d, e, f, g, h)
#define NVP_BATCH3D_A2 (size_t a, CUDA_MEMCPY3D_BATCH_OP *b, unsigned long long c, CUstream d)
#define NVP_PREFETCH_BATCH (CUdeviceptr *a, size_t *b, size_t c, CUmemLocation *d, size_t *e, size_t f, \
                            unsigned long long g, CUstream h)
#define NVP_DISCARD_BATCH (CUdeviceptr *a, size_t *b, size_t c, unsigned long long d, CUstream e)
#define NVP_UPLOAD (CUgraphExec a, CUstream b)
#define NVP_MAPARRAY (CUarrayMapInfo *a, unsigned int b, CUstream c)
#define NVP_SEM_SIGNAL (const CUexternalSemaphore *a, const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS *b, \
                        unsigned int c, CUstream d)
#define NVP_SEM_WAIT (const CUexternalSemaphore *a, const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS *b, \
                      unsigned int c, CUstream d)
#define NVP_SET8 (CUdeviceptr a, unsigned char b, size_t c)
#define NVP_SET16 (CUdeviceptr a, unsigned short b, size_t c)
#define NVP_SET32 (CUdeviceptr a, unsigned int b, size_t c)
#define NVP_SET8_A (CUdeviceptr a, unsigned char b, size_t c, CUstream d)
#define NVP_SET16_A (CUdeviceptr a, unsigned short b, size_t c, CUstream d)
#define NVP_SET32_A (CUdeviceptr a, unsigned int b, size_t c, CUstream d)
#define NVP_SET2D8 (CUdeviceptr a, size_t b, unsigned char c, size_t d, size_t e)
#define NVP_SET2D16 (CUdeviceptr a, size_t b, unsigned short c, size_t d, size_t e)
#define NVP_SET2D32 (CUdeviceptr a, size_t b, unsigned int c, size_t d, size_t e)
#define NVP_SET2D8_A (CUdeviceptr a, size_t b, unsigned char c, size_t d, size_t e, CUstream f)
#define NVP_SET2D16_A (CUdeviceptr a, size_t b, unsigned short c, size_t d, size_t e, CUstream f)
#define NVP_SET2D32_A (CUdeviceptr a, size_t b, unsigned int c, size_t d, size_t e, CUstream f)
#define NVP_LAUNCH (CUfunction a, unsigned int b, unsigned int c, unsigned int d, unsigned int e, \
                    unsigned int f, unsigned int g, unsigned int h, CUstream i, void **j, void **k)
#define NVA_11 (a, b, c, d, e, f, g, h, i, j, k)
#define NVP_LAUNCH_EX (const CUlaunchConfig *a, CUfunction b, void **c, void **d)
#define NVP_LAUNCH_COOP (CUfunction a, unsigned int b, unsigned int c, unsigned int d, unsigned int e, \
                         unsigned int f, unsigned int g, unsigned int h, CUstream i, void **j)
#define NVA_10 (a, b, c, d, e, f, g, h, i, j)
#define NVP_GRAPH (CUgraphExec a, CUstream b)
#define NVP_PREFETCH (CUdeviceptr a, size_t b, CUdevice c, CUstream d)
#define NVP_PREFETCH2 (CUdeviceptr a, size_t b, CUmemLocation c, unsigned int d, CUstream e)
#define NVP_WAIT32 (CUstream a, CUdeviceptr b, cuuint32_t c, unsigned int d)
#define NVP_WAIT64 (CUstream a, CUdeviceptr b, cuuint64_t c, unsigned int d)
#define NVP_BATCHOP (CUstream a, unsigned int b, CUstreamBatchMemOpParams *c, unsigned int d)
#define NVP_V1_HTOD (CUdeviceptr_v1 a, const void *b, unsigned int c)
#define NVP_V1_DTOH (void *a, CUdeviceptr_v1 b, unsigned int c)
#define NVP_V1_DTOD (CUdeviceptr_v1 a, CUdeviceptr_v1 b, unsigned int c)
#define NVP_V1_SET8 (CUdeviceptr_v1 a, unsigned char b, unsigned int c)
#define NVP_V1_SET16 (CUdeviceptr_v1 a, unsigned short b, unsigned int c)
#define NVP_V1_SET32 (CUdeviceptr_v1 a, unsigned int b, unsigned int c)

#define NVSHARE_SYMBOLS(GATE, OWN)                                                              \
    /* initialisation, contexts, lookup */                                                     \
    OWN(cuInit, (unsigned int flags))                                                          \
    OWN(cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)) \
    OWN(cuGetProcAddress_v2, (const char *symbol, void **pfn, int cudaVersion,                 \
                              cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)) \
    OWN(cuCtxCreate, (CUcontext *pctx, unsigned int flags, CUdevice dev))                      \
    OWN(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev))                   \
    OWN(cuCtxCreate_v3, (CUcontext *pctx, CUexecAffinityParam *params, int n,                  \
                         unsigned int flags, CUdevice dev))                                    \
    OWN(cuCtxCreate_v4, (CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,       \
                         CUdevice dev))                                                        \
    OWN(cuCtxDestroy, (CUcontext ctx))                                                         \
    /* waiting for the GPU's work: counted as demand (demand.c), never gated */                \
    OWN(cuCtxSynchronize, (void))                                                              \
    OWN(cuCtxSynchronize_v2, (CUcontext ctx))                                                  \
    OWN(cuStreamSynchronize, (CUstream stream))                                                \
    OWN(cuStreamSynchronize_ptsz, (CUstream stream))                                           \
    OWN(cuEventSynchronize, (CUevent event))                                                   \
    OWN(cuCtxDestroy_v2, (CUcontext ctx))                                                      \
    OWN(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev))                             \
    OWN(cuDevicePrimaryCtxRelease, (CUdevice dev))                                             \
    OWN(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                          \
    OWN(cuDevicePrimaryCtxReset, (CUdevice dev))                                               \
    OWN(cuDevicePrimaryCtxReset_v2, (CUdevice dev))                                            \
    OWN(cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags))                           \
    OWN(cuGreenCtxCreate, (CUgreenCtx *green, CUdevResourceDesc desc, CUdevice dev,            \
                           unsigned int flags))                                                \
    OWN(cuGreenCtxDestroy, (CUgreenCtx green))                                                 \
    /* graph capture: a drain waits for open captures instead of breaking them */              \
    OWN(cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode))                  \
    OWN(cuStreamBeginCapture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode))             \
    OWN(cuStreamBeginCaptureToGraph, (CUstream stream, CUgraph graph,                          \
                                      const CUgraphNode *deps, const CUgraphEdgeData *edges,   \
                                      size_t n, CUstreamCaptureMode mode))                     \
    OWN(cuStreamBeginCaptureToGraph_ptsz, (CUstream stream, CUgraph graph,                     \
                                           const CUgraphNode *deps, const CUgraphEdgeData *edges, \
                                           size_t n, CUstreamCaptureMode mode))                \
    OWN(cuStreamEndCapture, (CUstream stream, CUgraph *graph))                                 \
    OWN(cuStreamEndCapture_ptsz, (CUstream stream, CUgraph *graph))                            \
    /* memory accounting */                                                                    \
    OWN(cuMemAlloc, (CUdeviceptr_v1 *dptr, unsigned int bytesize))                             \
    OWN(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize))                                   \
    OWN(cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,    \
                             unsigned int elementSize))                                        \
    OWN(cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags))           \
    OWN(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream stream))                \
    OWN(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream stream))           \
    OWN(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,       \
                                  CUstream stream))                                            \
    OWN(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,  \
                                       CUstream stream))                                       \
    OWN(cuMemFree, (CUdeviceptr_v1 dptr))                                                      \
    OWN(cuMemFree_v2, (CUdeviceptr dptr))                                                      \
    OWN(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream))                                   \
    OWN(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream))                              \
    OWN(cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size,                       \
                      const CUmemAllocationProp *prop, unsigned long long flags))              \
    OWN(cuMemRelease, (CUmemGenericAllocationHandle handle))                                   \
    OWN(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset,                                \
                   CUmemGenericAllocationHandle handle, unsigned long long flags))             \
    OWN(cuMemUnmap, (CUdeviceptr ptr, size_t size))                                            \
    OWN(cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *props))                    \
    OWN(cuMemPoolDestroy, (CUmemoryPool pool))                                                 \
    OWN(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep))                                     \
    OWN(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void *value))                     \
    OWN(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev))                                    \
    OWN(cuArrayCreate_v2, (CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc))                 \
    OWN(cuArray3DCreate_v2, (CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc))             \
    OWN(cuArrayDestroy, (CUarray array))                                                       \
    OWN(cuMipmappedArrayCreate, (CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc, \
                                 unsigned int levels))                                         \
    OWN(cuMipmappedArrayDestroy, (CUmipmappedArray array))                                     \
    /* swappable memory described as the one allocation it is */                               \
    OWN(cuMemGetAddressRange_v2, (CUdeviceptr *base, size_t *size, CUdeviceptr ptr))           \
    OWN(cuPointerGetAttribute, (void *data, int attr, CUdeviceptr ptr))                        \
    OWN(cuPointerGetAttributes, (unsigned int n, int *attrs, void **data, CUdeviceptr ptr))    \
    OWN(cuIpcGetMemHandle, (CUipcMemHandle *handle, CUdeviceptr ptr))                          \
    OWN(cuIpcOpenMemHandle, (CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags))    \
    OWN(cuIpcOpenMemHandle_v2, (CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)) \
    OWN(cuIpcCloseMemHandle, (CUdeviceptr dptr))                                               \
    OWN(cuMemGetInfo, (unsigned int *free_bytes, unsigned int *total_bytes))                   \
    OWN(cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes))                           \
    /* kernels and graphs */                                                                   \
    OWN(cuLaunchKernel, NVP_LAUNCH)                                                            \
    OWN(cuLaunchKernel_ptsz, NVP_LAUNCH)                                                       \
    OWN(cuLaunchKernelEx, NVP_LAUNCH_EX)                                                       \
    OWN(cuLaunchKernelEx_ptsz, NVP_LAUNCH_EX)                                                  \
    OWN(cuLaunchCooperativeKernel, NVP_LAUNCH_COOP)                                            \
    OWN(cuLaunchCooperativeKernel_ptsz, NVP_LAUNCH_COOP)                                       \
    GATE(cuLaunch, (CUfunction a), NVA_1)                                                      \
    GATE(cuLaunchGrid, (CUfunction a, int b, int c), NVA_3)                                    \
    GATE(cuLaunchGridAsync, (CUfunction a, int b, int c, CUstream d), NVA_4)                   \
    OWN(cuGraphLaunch, NVP_GRAPH)                                                              \
    OWN(cuGraphLaunch_ptsz, NVP_GRAPH)                                                         \
    GATE(cuGraphUpload, NVP_UPLOAD, NVA_2)                                                     \
    GATE(cuGraphUpload_ptsz, NVP_UPLOAD, NVA_2)                                                \
    /* synchronous copies */                                                                   \
    GATE(cuMemcpy, NVP_DTOD, NVA_3)                                                            \
    GATE(cuMemcpy_ptds, NVP_DTOD, NVA_3)                                                       \
    OWN(cuMemcpyPeer, NVP_PEER)                                                                \
    OWN(cuMemcpyPeer_ptds, NVP_PEER)                                                           \
    GATE(cuMemcpyHtoD, NVP_V1_HTOD, NVA_3)                                                     \
    GATE(cuMemcpyHtoD_v2, NVP_HTOD, NVA_3)                                                     \
    GATE(cuMemcpyHtoD_v2_ptds, NVP_HTOD, NVA_3)                                                \
    GATE(cuMemcpyDtoH, NVP_V1_DTOH, NVA_3)                                                     \
    GATE(cuMemcpyDtoH_v2, NVP_DTOH, NVA_3)                                                     \
    GATE(cuMemcpyDtoH_v2_ptds, NVP_DTOH, NVA_3)                                                \
    GATE(cuMemcpyDtoD, NVP_V1_DTOD, NVA_3)                                                     \
    GATE(cuMemcpyDtoD_v2, NVP_DTOD, NVA_3)                                                     \
    GATE(cuMemcpyDtoD_v2_ptds, NVP_DTOD, NVA_3)                                                \
    GATE(cuMemcpyDtoA_v2, NVP_DTOA, NVA_4)                                                     \
    GATE(cuMemcpyDtoA_v2_ptds, NVP_DTOA, NVA_4)                                                \
    GATE(cuMemcpyAtoD_v2, NVP_ATOD, NVA_4)                                                     \
    GATE(cuMemcpyAtoD_v2_ptds, NVP_ATOD, NVA_4)                                                \
    GATE(cuMemcpyHtoA_v2, NVP_HTOA, NVA_4)                                                     \
    GATE(cuMemcpyHtoA_v2_ptds, NVP_HTOA, NVA_4)                                                \
    GATE(cuMemcpyAtoH_v2, NVP_ATOH, NVA_4)                                                     \
    GATE(cuMemcpyAtoH_v2_ptds, NVP_ATOH, NVA_4)                                                \
    GATE(cuMemcpyAtoA_v2, NVP_ATOA, NVA_5)                                                     \
    GATE(cuMemcpyAtoA_v2_ptds, NVP_ATOA, NVA_5)                                                \
    GATE(cuMemcpy2D_v2, NVP_2D, NVA_1)                                                         \
    GATE(cuMemcpy2D_v2_ptds, NVP_2D, NVA_1)                                                    \
    GATE(cuMemcpy2DUnaligned_v2, NVP_2D, NVA_1)                                                \
    GATE(cuMemcpy2DUnaligned_v2_ptds, NVP_2D, NVA_1)                                           \
    GATE(cuMemcpy3D_v2, NVP_3D, NVA_1)                                                         \
    GATE(cuMemcpy3D_v2_ptds, NVP_3D, NVA_1)                                                    \
    OWN(cuMemcpy3DPeer, NVP_3DP)                                                               \
    OWN(cuMemcpy3DPeer_ptds, NVP_3DP)                                                          \
    /* asynchronous copies */                                                                  \
    OWN(cuMemcpyAsync, NVP_DTOD_A)                                                             \
    OWN(cuMemcpyAsync_ptsz, NVP_DTOD_A)                                                        \
    OWN(cuMemcpyPeerAsync, NVP_PEER_A)                                                         \
    OWN(cuMemcpyPeerAsync_ptsz, NVP_PEER_A)                                                    \
    OWN(cuMemcpyHtoDAsync_v2, NVP_HTOD_A)                                                      \
    OWN(cuMemcpyHtoDAsync_v2_ptsz, NVP_HTOD_A)                                                 \
    OWN(cuMemcpyDtoHAsync_v2, NVP_DTOH_A)                                                      \
    OWN(cuMemcpyDtoHAsync_v2_ptsz, NVP_DTOH_A)                                                 \
    OWN(cuMemcpyDtoDAsync_v2, NVP_DTOD_A)                                                      \
    OWN(cuMemcpyDtoDAsync_v2_ptsz, NVP_DTOD_A)                                                 \
    GATE(cuMemcpyHtoAAsync_v2, NVP_HTOA_A, NVA_5)                                              \
    GATE(cuMemcpyHtoAAsync_v2_ptsz, NVP_HTOA_A, NVA_5)                                         \
    GATE(cuMemcpyAtoHAsync_v2, NVP_ATOH_A, NVA_5)                                              \
    GATE(cuMemcpyAtoHAsync_v2_ptsz, NVP_ATOH_A, NVA_5)                                         \
    OWN(cuMemcpy2DAsync_v2, NVP_2D_A)                                                          \
    OWN(cuMemcpy2DAsync_v2_ptsz, NVP_2D_A)                                                     \
    OWN(cuMemcpy3DAsync_v2, NVP_3D_A)                                                          \
    OWN(cuMemcpy3DAsync_v2_ptsz, NVP_3D_A)                                                     \
    OWN(cuMemcpy3DPeerAsync, NVP_3DP_A)                                                        \
    OWN(cuMemcpy3DPeerAsync_ptsz, NVP_3DP_A)                                                   \
    GATE(cuMemcpyBatchAsync, NVP_BATCH_A, NVA_9)                                               \
    GATE(cuMemcpyBatchAsync_ptsz, NVP_BATCH_A, NVA_9)                                          \
    GATE(cuMemcpy3DBatchAsync, NVP_BATCH3D_A, NVA_5)                                           \
    GATE(cuMemcpy3DBatchAsync_ptsz, NVP_BATCH3D_A, NVA_5)                                      \
    GATE(cuMemcpyBatchAsync_v2, NVP_BATCH_A2, NVA_8)                                           \
    GATE(cuMemcpyBatchAsync_v2_ptsz, NVP_BATCH_A2, NVA_8)                                      \
    GATE(cuMemcpy3DBatchAsync_v2, NVP_BATCH3D_A2, NVA_4)                                       \
    GATE(cuMemcpy3DBatchAsync_v2_ptsz, NVP_BATCH3D_A2, NVA_4)                                  \
    /* memset */                                                                               \
    GATE(cuMemsetD8, NVP_V1_SET8, NVA_3)                                                       \
    GATE(cuMemsetD16, NVP_V1_SET16, NVA_3)                                                     \
    GATE(cuMemsetD32, NVP_V1_SET32, NVA_3)                                                     \
    GATE(cuMemsetD8_v2, NVP_SET8, NVA_3)                                                       \
    GATE(cuMemsetD8_v2_ptds, NVP_SET8, NVA_3)                                                  \
    GATE(cuMemsetD16_v2, NVP_SET16, NVA_3)                                                     \
    GATE(cuMemsetD16_v2_ptds, NVP_SET16, NVA_3)                                                \
    GATE(cuMemsetD32_v2, NVP_SET32, NVA_3)                                                     \
    GATE(cuMemsetD32_v2_ptds, NVP_SET32, NVA_3)                                                \
    GATE(cuMemsetD2D8_v2, NVP_SET2D8, NVA_5)                                                   \
    GATE(cuMemsetD2D8_v2_ptds, NVP_SET2D8, NVA_5)                                              \
    GATE(cuMemsetD2D16_v2, NVP_SET2D16, NVA_5)                                                 \
    GATE(cuMemsetD2D16_v2_ptds, NVP_SET2D16, NVA_5)                                            \
    GATE(cuMemsetD2D32_v2, NVP_SET2D32, NVA_5)                                                 \
    GATE(cuMemsetD2D32_v2_ptds, NVP_SET2D32, NVA_5)                                            \
    OWN(cuMemsetD8Async, NVP_SET8_A)                                                           \
    OWN(cuMemsetD8Async_ptsz, NVP_SET8_A)                                                      \
    OWN(cuMemsetD16Async, NVP_SET16_A)                                                         \
    OWN(cuMemsetD16Async_ptsz, NVP_SET16_A)                                                    \
    OWN(cuMemsetD32Async, NVP_SET32_A)                                                         \
    OWN(cuMemsetD32Async_ptsz, NVP_SET32_A)                                                    \
    OWN(cuMemsetD2D8Async, NVP_SET2D8_A)                                                       \
    OWN(cuMemsetD2D8Async_ptsz, NVP_SET2D8_A)                                                  \
    OWN(cuMemsetD2D16Async, NVP_SET2D16_A)                                                     \
    OWN(cuMemsetD2D16Async_ptsz, NVP_SET2D16_A)                                                \
    OWN(cuMemsetD2D32Async, NVP_SET2D32_A)                                                     \
    OWN(cuMemsetD2D32Async_ptsz, NVP_SET2D32_A)                                                \
    /* prefetch and stream memory operations */                                                \
    GATE(cuMemPrefetchAsync, NVP_PREFETCH, NVA_4)                                              \
    GATE(cuMemPrefetchAsync_ptsz, NVP_PREFETCH, NVA_4)                                         \
    GATE(cuMemPrefetchAsync_v2, NVP_PREFETCH2, NVA_5)                                          \
    GATE(cuMemPrefetchAsync_v2_ptsz, NVP_PREFETCH2, NVA_5)                                     \
    GATE(cuMemPrefetchBatchAsync, NVP_PREFETCH_BATCH, NVA_8)                                   \
    GATE(cuMemPrefetchBatchAsync_ptsz, NVP_PREFETCH_BATCH, NVA_8)                              \
    GATE(cuMemDiscardBatchAsync, NVP_DISCARD_BATCH, NVA_5)                                     \
    GATE(cuMemDiscardBatchAsync_ptsz, NVP_DISCARD_BATCH, NVA_5)                                \
    GATE(cuMemDiscardAndPrefetchBatchAsync, NVP_PREFETCH_BATCH, NVA_8)                         \
    GATE(cuMemDiscardAndPrefetchBatchAsync_ptsz, NVP_PREFETCH_BATCH, NVA_8)                    \
    GATE(cuStreamWaitValue32, NVP_WAIT32, NVA_4)                                               \
    GATE(cuStreamWaitValue32_ptsz, NVP_WAIT32, NVA_4)                                          \
    GATE(cuStreamWaitValue32_v2, NVP_WAIT32, NVA_4)                                            \
    GATE(cuStreamWaitValue32_v2_ptsz, NVP_WAIT32, NVA_4)                                       \
    GATE(cuStreamWaitValue64, NVP_WAIT64, NVA_4)                                               \
    GATE(cuStreamWaitValue64_ptsz, NVP_WAIT64, NVA_4)                                          \
    GATE(cuStreamWaitValue64_v2, NVP_WAIT64, NVA_4)                                            \
    GATE(cuStreamWaitValue64_v2_ptsz, NVP_WAIT64, NVA_4)                                       \
    GATE(cuStreamWriteValue32, NVP_WAIT32, NVA_4)                                              \
    GATE(cuStreamWriteValue32_ptsz, NVP_WAIT32, NVA_4)                                         \
    GATE(cuStreamWriteValue32_v2, NVP_WAIT32, NVA_4)                                           \
    GATE(cuStreamWriteValue32_v2_ptsz, NVP_WAIT32, NVA_4)                                      \
    GATE(cuStreamWriteValue64, NVP_WAIT64, NVA_4)                                              \
    GATE(cuStreamWriteValue64_ptsz, NVP_WAIT64, NVA_4)                                         \
    GATE(cuStreamWriteValue64_v2, NVP_WAIT64, NVA_4)                                           \
    GATE(cuStreamWriteValue64_v2_ptsz, NVP_WAIT64, NVA_4)                                      \
    GATE(cuStreamBatchMemOp, NVP_BATCHOP, NVA_4)                                               \
    GATE(cuStreamBatchMemOp_ptsz, NVP_BATCHOP, NVA_4)                                          \
    GATE(cuStreamBatchMemOp_v2, NVP_BATCHOP, NVA_4)                                            \
    GATE(cuStreamBatchMemOp_v2_ptsz, NVP_BATCHOP, NVA_4)                                      \
    /* stream-ordered work that is not a kernel */                                             \
    GATE(cuMemMapArrayAsync, NVP_MAPARRAY, NVA_3)                                              \
    GATE(cuMemMapArrayAsync_ptsz, NVP_MAPARRAY, NVA_3)                                         \
    GATE(cuSignalExternalSemaphoresAsync, NVP_SEM_SIGNAL, NVA_4)                               \
    GATE(cuSignalExternalSemaphoresAsync_ptsz, NVP_SEM_SIGNAL, NVA_4)                          \
    GATE(cuWaitExternalSemaphoresAsync, NVP_SEM_WAIT, NVA_4)                                   \
    GATE(cuWaitExternalSemaphoresAsync_ptsz, NVP_SEM_WAIT, NVA_4)

#endif
