/* driver.c: the bottom layer. Loading libcuda.so.1, the block of real driver functions, the real
 * dlsym, and the thread-local re-entrancy flag. Every other part calls down to here; this file calls
 * only env.c (the settings decide whether a missing driver is worth a log line).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

#include "driver.h"
#include "env.h"

struct nvshare_real nvshare_real;
atomic_int nvshare_driver_ok;
NVSHARE_TLS int nvshare_in_hook;
nvshare_dlsym_fn nvshare_real_dlsym;

static void *driver_handle;
static pthread_once_t prepare_once = PTHREAD_ONCE_INIT;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void resolve_dlsym(void)
{
    /* The real dlsym of whichever glibc this is; dlvsym is not interposed. */
    nvshare_real_dlsym = (nvshare_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
#if defined(__x86_64__)
    if (!nvshare_real_dlsym)
        nvshare_real_dlsym = (nvshare_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
#elif defined(__aarch64__)
    if (!nvshare_real_dlsym)
        nvshare_real_dlsym = (nvshare_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
#endif
}

static void prepare(void)
{
    nvshare_read_settings();
    resolve_dlsym();
}

void nvshare_driver_prepare(void)
{
    pthread_once(&prepare_once, prepare);
}

void *nvshare_driver_handle(void)
{
    return driver_handle;
}

static void load_driver_once(void)
{
    nvshare_driver_prepare();
    nvshare_in_hook++;
    driver_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!driver_handle || !nvshare_real_dlsym) {
        if (nvshare_cfg.active)
            nvshare_log("cannot load libcuda.so.1 (%s); CUDA calls will fail as without nvshare",
                        driver_handle ? "no dlsym" : dlerror());
        nvshare_in_hook--;
        return;
    }
#define RESOLVE(name, ...) nvshare_real.name = (name##_fn)nvshare_real_dlsym(driver_handle, #name);
    NVSHARE_SYMBOLS(RESOLVE, RESOLVE)  /* optional: absent in older drivers */
    RESOLVE(cuCtxGetCurrent)
    RESOLVE(cuCtxGetDevice)
    RESOLVE(cuCtxPushCurrent_v2)
    RESOLVE(cuCtxPopCurrent_v2)
    RESOLVE(cuDeviceGetUuid)
    RESOLVE(cuDeviceGetUuid_v2)
    RESOLVE(cuDeviceGet)
    RESOLVE(cuStreamGetCtx)
    RESOLVE(cuDeviceGetAttribute)
    RESOLVE(cuDeviceGetCount)
    RESOLVE(cuDeviceCanAccessPeer)
    RESOLVE(cuMemGetAllocationGranularity)
    RESOLVE(cuMemAddressReserve)
    RESOLVE(cuMemAddressFree)
    RESOLVE(cuMemSetAccess)
    RESOLVE(cuMemHostAlloc)
    RESOLVE(cuMemFreeHost)
    RESOLVE(cuMemHostRegister_v2)
    RESOLVE(cuMemHostUnregister)
    RESOLVE(cuMemPoolGetAttribute)
    RESOLVE(cuDeviceGetDefaultMemPool)
    RESOLVE(cuDeviceGetMemPool)
    RESOLVE(cuDeviceGetGraphMemAttribute)
    RESOLVE(cuCtxFromGreenCtx)
    RESOLVE(cuDevicePrimaryCtxGetState)
    RESOLVE(cuMemExportToShareableHandle)
    RESOLVE(cuMemImportFromShareableHandle)
    RESOLVE(cuEventCreate)
    RESOLVE(cuMemHostGetDevicePointer_v2)
    RESOLVE(cuEventRecord)
    RESOLVE(cuEventQuery)
    RESOLVE(cuEventDestroy_v2)
    nvshare_real.cuEventElapsedTime = (cuEventElapsedTime_fn)nvshare_real_dlsym(driver_handle, "cuEventElapsedTime_v2");
    if (!nvshare_real.cuEventElapsedTime)
        RESOLVE(cuEventElapsedTime)
#undef RESOLVE
    nvshare_in_hook--;
    /* Required to tell GPUs apart and to drain them; without them nothing can be gated safely. */
    if (!nvshare_real.cuInit || !nvshare_real.cuCtxGetCurrent || !nvshare_real.cuCtxGetDevice ||
        !nvshare_real.cuCtxSynchronize || !nvshare_real.cuCtxPushCurrent_v2 ||
        !nvshare_real.cuCtxPopCurrent_v2 || !nvshare_real.cuDeviceGet ||
        (!nvshare_real.cuDeviceGetUuid && !nvshare_real.cuDeviceGetUuid_v2)) {
        if (nvshare_cfg.active)
            nvshare_log("libcuda.so.1 lacks functions nvshare needs; GPU sharing is off");
        nvshare_cfg.active = 0;
    }
    atomic_store(&nvshare_driver_ok, 1);
}

int nvshare_load_driver(void)
{
    pthread_once(&driver_once, load_driver_once);
    return atomic_load(&nvshare_driver_ok) ? 0 : -1;
}
