/* driver.h: the bottom of libnvshare.so. The real driver functions, loading libcuda.so.1, and the
 * re-entrancy flag that every part sets around its own calls into the driver (driver.c).
 * Nothing here is exported: the library is built with -fvisibility=hidden and a version script.
 */
#ifndef NVSHARE_DRIVER_H
#define NVSHARE_DRIVER_H

#include <stdatomic.h>

#include "cuda_subset.h"
#include "hook_symbols.h"

/* Hidden as declared, not only as defined: another file's global is then read with one rip-relative
 * load, as in its own file, not through the GOT (the launch path reads nvshare_real and
 * nvshare_driver_ok, which moved out of hook.c into driver.c). */
#pragma GCC visibility push(hidden)

#define NVSHARE_EXPORT __attribute__((visibility("default")))
/* Thread-locals without __tls_get_addr on the launch path: the library is loaded at start-up. */
#define NVSHARE_TLS __thread __attribute__((tls_model("initial-exec")))

#define NVSHARE_REAL_TYPEDEF(name, params, ...) typedef CUresult (*name##_fn) params;
NVSHARE_SYMBOLS(NVSHARE_REAL_TYPEDEF, NVSHARE_REAL_TYPEDEF)

/* Driver functions the hook calls itself but does not interpose. */
typedef CUresult (*cuCtxGetCurrent_fn)(CUcontext *ctx);
typedef CUresult (*cuCtxGetDevice_fn)(CUdevice *dev);
typedef CUresult (*cuCtxPushCurrent_v2_fn)(CUcontext ctx);
typedef CUresult (*cuCtxPopCurrent_v2_fn)(CUcontext *ctx);
typedef CUresult (*cuDeviceGetUuid_fn)(CUuuid *uuid, CUdevice dev);
typedef CUresult (*cuDeviceGetUuid_v2_fn)(CUuuid *uuid, CUdevice dev);
typedef CUresult (*cuDeviceGet_fn)(CUdevice *dev, int ordinal);
typedef CUresult (*cuStreamGetCtx_fn)(CUstream stream, CUcontext *ctx);
typedef CUresult (*cuDeviceGetAttribute_fn)(int *value, int attrib, CUdevice dev);
typedef CUresult (*cuDeviceGetCount_fn)(int *count);
typedef CUresult (*cuDeviceCanAccessPeer_fn)(int *can, CUdevice dev, CUdevice peer);
typedef CUresult (*cuMemGetAllocationGranularity_fn)(size_t *granularity, const CUmemAllocationProp *prop,
                                                     int option);
typedef CUresult (*cuMemAddressReserve_fn)(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                           unsigned long long flags);
typedef CUresult (*cuMemAddressFree_fn)(CUdeviceptr ptr, size_t size);
typedef CUresult (*cuMemSetAccess_fn)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
typedef CUresult (*cuMemHostAlloc_fn)(void **pp, size_t bytesize, unsigned int flags);
typedef CUresult (*cuMemFreeHost_fn)(void *p);
typedef CUresult (*cuMemHostRegister_v2_fn)(void *p, size_t bytesize, unsigned int flags);
typedef CUresult (*cuMemHostUnregister_fn)(void *p);
typedef CUresult (*cuMemPoolGetAttribute_fn)(CUmemoryPool pool, int attr, void *value);
typedef CUresult (*cuDeviceGetDefaultMemPool_fn)(CUmemoryPool *pool, CUdevice dev);
typedef CUresult (*cuDeviceGetMemPool_fn)(CUmemoryPool *pool, CUdevice dev);
typedef CUresult (*cuDeviceGetGraphMemAttribute_fn)(CUdevice dev, int attr, void *value);
typedef CUresult (*cuCtxFromGreenCtx_fn)(CUcontext *ctx, CUgreenCtx green);
typedef CUresult (*cuDevicePrimaryCtxGetState_fn)(CUdevice dev, unsigned int *flags, int *active);
typedef CUresult (*cuMemExportToShareableHandle_fn)(void *shareable, CUmemGenericAllocationHandle handle,
                                                    int type, unsigned long long flags);
typedef CUresult (*cuEventCreate_fn)(CUevent *event, unsigned int flags);
typedef CUresult (*cuMemHostGetDevicePointer_v2_fn)(CUdeviceptr *dptr, void *p, unsigned int flags);
typedef CUresult (*cuEventRecord_fn)(CUevent event, CUstream stream);
typedef CUresult (*cuEventQuery_fn)(CUevent event);
typedef CUresult (*cuEventElapsedTime_fn)(float *ms, CUevent start, CUevent end);
typedef CUresult (*cuEventDestroy_v2_fn)(CUevent event);
typedef CUresult (*cuMemImportFromShareableHandle_fn)(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                      int type);

struct nvshare_real {
#define NVSHARE_REAL_MEMBER(name, ...) name##_fn name;
    NVSHARE_SYMBOLS(NVSHARE_REAL_MEMBER, NVSHARE_REAL_MEMBER)
    cuCtxGetCurrent_fn cuCtxGetCurrent;
    cuCtxGetDevice_fn cuCtxGetDevice;
    cuCtxPushCurrent_v2_fn cuCtxPushCurrent_v2;
    cuCtxPopCurrent_v2_fn cuCtxPopCurrent_v2;
    cuDeviceGetUuid_fn cuDeviceGetUuid;
    cuDeviceGetUuid_v2_fn cuDeviceGetUuid_v2;
    cuDeviceGet_fn cuDeviceGet;
    cuStreamGetCtx_fn cuStreamGetCtx;
    /* swap (swap.c): optional; without them every allocation is fixed */
    cuDeviceGetAttribute_fn cuDeviceGetAttribute;
    cuDeviceGetCount_fn cuDeviceGetCount;
    cuDeviceCanAccessPeer_fn cuDeviceCanAccessPeer;
    cuMemGetAllocationGranularity_fn cuMemGetAllocationGranularity;
    cuMemAddressReserve_fn cuMemAddressReserve;
    cuMemAddressFree_fn cuMemAddressFree;
    cuMemSetAccess_fn cuMemSetAccess;
    cuMemHostAlloc_fn cuMemHostAlloc;
    cuMemFreeHost_fn cuMemFreeHost;
    cuMemHostRegister_v2_fn cuMemHostRegister_v2;   /* optional: hostpin.c falls back to cuMemHostAlloc */
    cuMemHostUnregister_fn cuMemHostUnregister;
    /* pools (memory.c): optional; without them pool memory is not seen */
    cuMemPoolGetAttribute_fn cuMemPoolGetAttribute;
    cuDeviceGetDefaultMemPool_fn cuDeviceGetDefaultMemPool;
    cuDeviceGetMemPool_fn cuDeviceGetMemPool;
    cuDeviceGetGraphMemAttribute_fn cuDeviceGetGraphMemAttribute;
    cuCtxFromGreenCtx_fn cuCtxFromGreenCtx;  /* green contexts' work is drained with their context */
    cuDevicePrimaryCtxGetState_fn cuDevicePrimaryCtxGetState;  /* a release that leaves it alive */
    /* CUDA IPC of swappable memory (ipc.c): optional; without them it needs NVSHARE_SWAP=off */
    cuMemExportToShareableHandle_fn cuMemExportToShareableHandle;
    cuMemImportFromShareableHandle_fn cuMemImportFromShareableHandle;
    /* pacing (pace.c): optional; without them launches are not paced */
    cuEventCreate_fn cuEventCreate;
    cuMemHostGetDevicePointer_v2_fn cuMemHostGetDevicePointer_v2;
    cuEventRecord_fn cuEventRecord;
    cuEventQuery_fn cuEventQuery;
    cuEventElapsedTime_fn cuEventElapsedTime;   /* _v2 where the driver has it (CUDA 12.8 on) */
    cuEventDestroy_v2_fn cuEventDestroy_v2;
};
extern struct nvshare_real nvshare_real;

/* Reads the settings (env.c) and finds the real dlsym, once; every way into the library calls it
 * before anything else (the constructor, dlsym, the driver's loading). */
void nvshare_driver_prepare(void);
typedef void *(*nvshare_dlsym_fn)(void *, const char *);
/* The real dlsym of whichever glibc this is (NULL until nvshare_driver_prepare ran). */
extern nvshare_dlsym_fn nvshare_real_dlsym;
/* The handle of libcuda.so.1 once loaded, else NULL. */
void *nvshare_driver_handle(void);

/* Loads libcuda.so.1 and resolves every real function once; 0 when the driver is usable. */
int nvshare_load_driver(void);
/* 1 once the driver's required functions are resolved. */
extern atomic_int nvshare_driver_ok;

/* The start of every hand-written wrapper. The driver is loaded before any real pointer is read (a
 * thread never sees the block half filled): NOT_INITIALIZED when libcuda.so.1 cannot be used at all,
 * NOT_FOUND when this driver lacks the function, as the real dlsym + call would give. */
#define REAL_OR_FAIL(name)                                                                       \
    do {                                                                                         \
        if (__builtin_expect(!atomic_load_explicit(&nvshare_driver_ok, memory_order_acquire), 0) && \
            nvshare_load_driver() != 0)                                                          \
            return CUDA_ERROR_NOT_INITIALIZED;                                                   \
        if (!nvshare_real.name)                                                                  \
            return CUDA_ERROR_NOT_FOUND;                                                         \
    } while (0)

/* Re-entrancy guard: set while the hook itself calls into the driver or the loader, and for the
 * whole life of the hook's own threads. */
extern NVSHARE_TLS int nvshare_in_hook;

#pragma GCC visibility pop

#endif
