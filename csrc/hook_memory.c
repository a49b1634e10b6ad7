/* hook_memory.c: interposition of the driver's memory functions. Each wrapper asks memory.c before
 * the driver allocates and tells it after (memory.c accounts and talks to the daemon), backs
 * cudaMalloc with swappable memory (swap.c), describes swappable memory as cuMemAlloc would, and
 * carries CUDA IPC of it (ipc.c). Policy lives in those files; here is only what each driver function
 * means to them. A NOGPU answer opens the GPU's gate for good (gate.c).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "env.h"
#include "gate.h"
#include "gpus.h"
#include "ipc.h"
#include "memory.h"
#include "swap.h"

enum { KIND_PTR = NVSHARE_ALLOC_PTR, KIND_HANDLE = NVSHARE_ALLOC_HANDLE, KIND_ARRAY = NVSHARE_ALLOC_ARRAY };

static CUresult admit(struct nvshare_gpu *g, uint64_t bytes, uint32_t flags, int *deferred)
{
    int not_managed;
    CUresult rc = nvshare_memory_admit(g, bytes, flags, deferred, &not_managed);
    if (not_managed)
        nvshare_gate_pass_through(g);
    return rc;
}

/* ---- allocations ---------------------------------------------------------------------------- */
/* Every admitted allocation goes to the driver in a loop: the driver's out-of-memory on what nvshare
 * admitted is tried again while nvshare_memory_driver_oom says so (memory.c: the daemon hears of it,
 * then a back-off, until NVSHARE_OOM_WAIT_SEC). rc = the real call, flagged as the hook's own. */
#define CALL_ADMITTED(rc, g, bytes, call)                                                        \
    do {                                                                                         \
        struct nvshare_oom_wait oom_wait_ = {0};                                                 \
        do {                                                                                     \
            nvshare_in_hook++;                                                                   \
            (rc) = (call);                                                                       \
            nvshare_in_hook--;                                                                   \
        } while (nvshare_memory_driver_oom((g), (bytes), (rc), &oom_wait_));                     \
    } while (0)
#define ALLOC_WRAPPER(name, params, call, ptr_expr, size_expr, request_expr)                     \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *g = nvshare_gpu_for_current();                                       \
        CUresult rc = admit(g, (request_expr), 0, NULL);                                         \
        if (rc != CUDA_SUCCESS)                                                                  \
            return rc;                                                                           \
        CALL_ADMITTED(rc, g, (request_expr), nvshare_real.name call);                            \
        if (rc == CUDA_SUCCESS)                                                                  \
            nvshare_memory_record(g, (uint64_t)(ptr_expr), KIND_PTR, (size_expr));               \
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
    size_t swappable = nvshare_memory_accounted(g) && !nvshare_in_hook ? nvshare_swap_size(g, bytesize) : 0;
    int deferred;
    CUresult rc = admit(g, swappable ? swappable : bytesize, swappable ? NVSHARE_MEM_CAN_DEFER : 0,
                        &deferred);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (swappable && dptr) {
        /* The backing's cuMemCreate failing for room is tried again here, outside swap.c's lock. */
        struct nvshare_oom_wait oom_wait = {.flags = NVSHARE_MEM_CAN_DEFER, .deferred = deferred};
        do
            rc = nvshare_swap_alloc(g, dptr, swappable, oom_wait.deferred);
        while (nvshare_memory_driver_oom(g, swappable, rc, &oom_wait));
        if (rc == CUDA_SUCCESS) {
            /* Recorded even if the GPU went pass-through while admit() waited (a refused client):
             * only through the table does cuMemFree find swap.c's memory. */
            nvshare_memory_record_swappable(g, (uint64_t)*dptr, swappable);
            return rc;
        }
        if (rc != CUDA_ERROR_NOT_SUPPORTED)
            return rc;
    }
    CALL_ADMITTED(rc, g, bytesize, nvshare_real.cuMemAlloc_v2(dptr, bytesize));
    if (rc == CUDA_SUCCESS)
        nvshare_memory_record(g, (uint64_t)*dptr, KIND_PTR, bytesize);
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
    CALL_ADMITTED(rc, g, size, nvshare_real.cuMemCreate(handle, size, prop, flags));
    if (rc == CUDA_SUCCESS)
        nvshare_memory_record(g, *handle, KIND_HANDLE, size);
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
            nvshare_memory_unrecord((uint64_t)(key), kind);                                      \
        return rc;                                                                               \
    }

/* 1 when dptr was a swappable allocation and is freed now (its result in *rc). */
static int free_swappable(CUdeviceptr dptr, CUresult *rc)
{
    if (!nvshare_cfg.active || nvshare_in_hook || !dptr)
        return 0;
    struct nvshare_gpu *g = nvshare_memory_gpu_of((uint64_t)dptr, KIND_PTR);
    if (!g)
        return 0;
    /* Its exports go first: once freed, the address may be handed out again at once, and a new
     * allocation there must not be exported as the old one (an importer would map freed memory).
     * A free that fails then leaves the allocation unexported; opens already made keep working. */
    nvshare_ipc_forget(dptr);
    if (!nvshare_swap_free(g, dptr, rc))
        return 0;
    if (*rc == CUDA_SUCCESS)
        nvshare_memory_unrecord((uint64_t)dptr, KIND_PTR);
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
            nvshare_memory_unrecord((uint64_t)dptr, KIND_PTR);                                   \
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
    int not_managed;
    nvshare_memory_job_view(g, free_bytes, total_bytes, &not_managed);
    if (not_managed)
        nvshare_gate_pass_through(g);
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
    nvshare_memory_mapped(ptr, handle);
    return rc;
}

NVSHARE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL_OR_FAIL(cuMemUnmap);
    nvshare_in_hook++;
    CUresult rc = nvshare_real.cuMemUnmap(ptr, size);
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS || !nvshare_cfg.active || nvshare_in_hook)
        return rc;
    nvshare_memory_unmapped(ptr);
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
    nvshare_memory_released(handle);
    return rc;
}

/* ---- stream-ordered allocations: pools hold what they reserved, freed or not ---------------- */
#define ASYNC_ALLOC_WRAPPER(name, params, call, pool)                                            \
    NVSHARE_EXPORT CUresult name params                                                          \
    {                                                                                            \
        REAL_OR_FAIL(name);                                                                      \
        struct nvshare_gpu *g = nvshare_gpu_for_current();                                       \
        uint64_t asked = 0;                                                                      \
        if (nvshare_memory_accounted(g) && !nvshare_in_hook) {                                   \
            asked = nvshare_memory_pool_shortfall(g, (pool), bytesize);                          \
            CUresult admitted = admit(g, asked, 0, NULL);                                        \
            if (admitted != CUDA_SUCCESS)                                                        \
                return admitted;                                                                 \
        }                                                                                        \
        CUresult rc;                                                                             \
        CALL_ADMITTED(rc, g, asked ? asked : bytesize, nvshare_real.name call);                  \
        if (rc == CUDA_SUCCESS && !nvshare_in_hook)                                              \
            nvshare_memory_pools_changed(g);                                                     \
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
#define POOL_SAMPLE() (nvshare_in_hook ? (void)0 : nvshare_memory_pools_changed(nvshare_gpu_for_current()))
FREE_SWAPPABLE_WRAPPER(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream), POOL_SAMPLE())
FREE_SWAPPABLE_WRAPPER(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream), POOL_SAMPLE())

NVSHARE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REAL_OR_FAIL(cuMemPoolCreate);
    CUresult rc = nvshare_real.cuMemPoolCreate(pool, props);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook && props &&
        props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        nvshare_memory_pool_seen(nvshare_gpu_for_device(props->location.id), *pool);
    return rc;
}

NVSHARE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL_OR_FAIL(cuMemPoolDestroy);
    CUresult rc = nvshare_real.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook)
        nvshare_memory_pools_changed(nvshare_memory_pool_destroyed(pool));
    return rc;
}

NVSHARE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    REAL_OR_FAIL(cuMemPoolTrimTo);
    CUresult rc = nvshare_real.cuMemPoolTrimTo(pool, keep);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook)
        nvshare_memory_pools_changed(nvshare_memory_gpu_of_pool(pool));
    return rc;
}

NVSHARE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    REAL_OR_FAIL(cuMemPoolSetAttribute);
    CUresult rc = nvshare_real.cuMemPoolSetAttribute(pool, attr, value);
    if (rc == CUDA_SUCCESS && nvshare_cfg.active && !nvshare_in_hook)
        nvshare_memory_pools_changed(nvshare_memory_gpu_of_pool(pool));
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
        CALL_ADMITTED(rc, g, bytes, nvshare_real.name call);                                     \
        if (rc == CUDA_SUCCESS && array)                                                         \
            nvshare_memory_record(g, (uint64_t)(uintptr_t)*array, KIND_ARRAY, bytes);            \
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
