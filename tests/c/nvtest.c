/* nvtest: a CUDA driver client for the hook tests. It reaches the driver one of three ways, chosen
 * with --via (link: direct -lcuda calls; dlsym / dlsym_old: dlopen + dlsym in each glibc version;
 * procaddr / procaddr_pt: cuGetProcAddress the way PyTorch does it, asking for cuGetProcAddress
 * itself first), then runs the actions given on the command line, one output line each.
 *
 *   init  ctx:D  newctx:D  launch:US[:N]  launchex:US  burst:US:N:GAPMS  sync  alloc:BYTES  allocpitch:W:H  freeall
 *   serve:US:K:N:MEANMS:SEED  (a server: N requests of K kernels of US and a synchronise, arriving at
 *                              exponential intervals of mean MEANMS, seeded; a late request starts at once)
 *   allocfree:BYTES:N (N times alloc of BYTES and its free, each call timed: mean and median ns of each)
 *   free:I (the I-th live allocation; kept when the free fails)
 *   meminfo  copy  vm:BYTES  sleep:MS  fork  thread:D:US:N  join  whois  procaddr:NAME:VER:FLAGS
 *   waitfile:PATH (until PATH exists: the test acts between two steps)
 *   fill:I:HEX  check:I:HEX  (every byte of the I-th live allocation set to, compared with, HEX)
 *   pattern:BYTES:ROUNDS:US  (allocate, then ROUNDS times: a kernel of US, read back and check every
 *                             byte, write a new pattern; the data must survive swaps at its address)
 *   barrier:US:N:RANKS:RANK  (N rounds of an NCCL-like collective: the fake driver's barrier kernel,
 *                             which runs until all RANKS ranks of the FAKE_CUDA_BARRIER group launched
 *                             theirs, then US; then synchronise)
 *   tbarrier:D:US:N:RANKS:RANK  (the same in a new thread on device D, like one process driving
 *                             several GPUs; `join` waits for it)
 * Graphs, pools, the app's own virtual memory (direct calls, whatever --via says):
 *   capture:US:N:HOLDMS  (capture N kernels of US on a new stream, hold the capture open HOLDMS,
 *                         end it, replay the graph once and synchronise)
 *   asyncalloc:BYTES  asyncfreeall  poolkeep (default pool keeps all)  pooltrim (trim it to 0)
 *   vmkeep:BYTES (create, map, release the handle at once: still mapped)  vmdrop (unmap them)
 *   totalmem  stamp (CLOCK_MONOTONIC ns)  peer:D (enable access to device D's primary context)
 *   reset:D (cuDevicePrimaryCtxReset_v2)  manyctx:D:N (N new contexts on D; the last stays current)
 *   range:BYTES:OFFSET (cuMemAlloc, then the range of the pointer OFFSET bytes in, two ways)
 *   greenlaunch:US (a kernel of US on a stream of a new green context of the current device)
 *   array:W:H (a W x H CUDA array of float4)  arrayfree (destroys them)
 *   initrace:N  (N threads make their first CUDA calls at once, released together: init, context,
 *                allocate, free; the line counts the threads whose calls failed)
 *   forkgrow:N:FORKS  (a thread makes N small allocations, so the hook's table grows several times,
 *                while this thread forks FORKS children that exit at once; then all are freed)
 *   peercopy:D:BYTES:N  (N copies of BYTES from memory on the current device to memory on device D
 *                        with cuMemcpyPeer, every one checked)   peercopy3d:D:BYTES:N (cuMemcpy3DPeer)
 *   peercopy3darray:D  (cuMemcpy3DPeer from an array on the current device; srcContext names D's)
 * CUDA IPC between two processes (direct calls):
 *   ipcput:BYTES:PATH  (cuMemAlloc, fill with 0xa1, cuIpcGetMemHandle of a pointer in its middle, the
 *                       64 bytes to PATH)
 *   ipcwait:HEX:MS     (until the second half of that allocation holds byte HEX, or MS pass)
 *   ipcget:PATH:BYTES  (wait for PATH, cuIpcOpenMemHandle, check the first half is 0xa1, fill the
 *                       second half with 0xb2)   ipcclose (cuIpcCloseMemHandle)
 *   ipcraw:PATH:HEX    (cuIpcOpenMemHandle of PATH's 64 bytes with byte 8 onward overwritten by HEX,
 *                       or PATH as is when HEX is empty: forged and stale handles)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_subset.h"

/* Direct-link declarations (the fake driver and the real one export these names). */
CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult cuDeviceGetCount(int *);

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* The functions the actions use, each found through the chosen route. */
#define API(X) X(cuInit, "cuInit") X(cuDeviceGet, "cuDeviceGet")                                    \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") X(cuCtxSetCurrent, "cuCtxSetCurrent")   \
    X(cuCtxCreate_v2, "cuCtxCreate") X(cuModuleLoadData, "cuModuleLoadData")                        \
    X(cuModuleGetFunction, "cuModuleGetFunction") X(cuLaunchKernel, "cuLaunchKernel")               \
    X(cuLaunchKernelEx, "cuLaunchKernelEx") X(cuCtxSynchronize, "cuCtxSynchronize")                 \
    X(cuMemAlloc_v2, "cuMemAlloc") X(cuMemAllocPitch_v2, "cuMemAllocPitch")                         \
    X(cuMemFree_v2, "cuMemFree") X(cuMemGetInfo_v2, "cuMemGetInfo")                                 \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD") X(cuMemcpyDtoH_v2, "cuMemcpyDtoH")                           \
    X(cuMemCreate, "cuMemCreate") X(cuMemRelease, "cuMemRelease")                                   \
    X(cuMemAddressReserve, "cuMemAddressReserve") X(cuMemAddressFree, "cuMemAddressFree")           \
    X(cuMemMap, "cuMemMap") X(cuMemUnmap, "cuMemUnmap") X(cuMemSetAccess, "cuMemSetAccess")

static struct {
#define API_MEMBER(fn, base) __typeof__(&fn) fn;
    API(API_MEMBER)
} api;

static const char *route = "link";
static getproc_fn getproc;

static const char *versioned(const char *base)
{
    /* The exported name dlsym users ask for (what cuda.h's #defines turn the base name into). */
    static const char *map[][2] = {{"cuCtxCreate", "cuCtxCreate_v2"}, {"cuMemAlloc", "cuMemAlloc_v2"},
        {"cuMemAllocPitch", "cuMemAllocPitch_v2"}, {"cuMemFree", "cuMemFree_v2"},
        {"cuMemGetInfo", "cuMemGetInfo_v2"}, {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"},
        {"cuMemcpyDtoH", "cuMemcpyDtoH_v2"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i][0], base) == 0)
            return map[i][1];
    return base;
}

#if defined(__x86_64__)
__asm__(".symver dlsym_old, dlsym@GLIBC_2.2.5");
extern void *dlsym_old(void *, const char *);
#else
#define dlsym_old dlsym
#endif

static void resolve(void)
{
    if (strcmp(route, "link") == 0) {
#define API_LINK(fn, base) api.fn = fn;
        API(API_LINK)
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("error dlopen %s\n", dlerror());
        exit(2);
    }
    int old = strcmp(route, "dlsym_old") == 0;
    if (strcmp(route, "dlsym") == 0 || old) {
#define API_DLSYM(fn, base) api.fn = (__typeof__(&fn))(old ? dlsym_old(h, versioned(base)) : dlsym(h, versioned(base)));
        API(API_DLSYM)
        return;
    }
    /* PyTorch's way: find cuGetProcAddress, ask it for itself, then for everything else. */
    getproc_fn first = (getproc_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!first || first(("cuGetProcAddress"), (void **)&getproc, 12040, 0, NULL) != CUDA_SUCCESS) {
        printf("error cuGetProcAddress\n");
        exit(2);
    }
    cuuint64_t flags = strcmp(route, "procaddr_pt") == 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
#define API_PROC(fn, base) getproc(base, (void **)&api.fn, 12040, flags, NULL);
    API(API_PROC)
}

static void where(const char *label, void *fn)
{
    Dl_info info;
    if (!fn || !dladdr(fn, &info) || !info.dli_fname) {
        printf("whois %s none none\n", label);
        return;
    }
    const char *lib = strrchr(info.dli_fname, '/');
    printf("whois %s %s %s\n", label, lib ? lib + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?");
}

static void check(const char *what, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        printf("error %s rc=%d\n", what, rc);
        fflush(stdout);
        exit(2);
    }
}

/* A kernel of the fake driver by name, loaded once per thread and context. */
static CUfunction fake_kernel(const char *name, CUfunction *fn, CUcontext *fn_ctx)
{
    CUcontext cur = NULL;
    extern CUresult cuCtxGetCurrent(CUcontext *);
    cuCtxGetCurrent(&cur);
    if (!*fn || *fn_ctx != cur) {
        CUmodule m;
        check("cuModuleLoadData", api.cuModuleLoadData(&m, "fake"));
        check("cuModuleGetFunction", api.cuModuleGetFunction(fn, m, name));
        *fn_ctx = cur;
    }
    return *fn;
}

static CUfunction sleep_fn(void)
{
    static __thread CUfunction fn;
    static __thread CUcontext fn_ctx;
    return fake_kernel("sleep", &fn, &fn_ctx);
}

/* The fake driver's collective (a "barrier" kernel) in the current context. */
static CUfunction barrier_fn(void)
{
    static __thread CUfunction fn;
    static __thread CUcontext fn_ctx;
    return fake_kernel("barrier", &fn, &fn_ctx);
}

struct rank_thread { int dev; char arg[96]; pthread_t tid; };
static struct rank_thread rank_threads[8];
static int n_rank_threads;

static void collectives(char *arg);
static void use_device(int d, int create);

static void *rank_main(void *p)
{
    struct rank_thread *t = p;
    use_device(t->dev, 0);
    collectives(t->arg);
    return NULL;
}

static void collectives(char *arg)
{
    unsigned long long us = strtoull(arg, NULL, 10);
    int rounds = 1, ranks = 1, rank = 0;
    char *p = strchr(arg, ':');
    if (p) {
        rounds = atoi(++p);
        if ((p = strchr(p, ':'))) {
            ranks = atoi(++p);
            if ((p = strchr(p, ':')))
                rank = atoi(++p);
        }
    }
    void *params[] = {&us, &ranks, &rank};
    for (int i = 0; i < rounds; i++) {
        check("cuLaunchKernel", api.cuLaunchKernel(barrier_fn(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        check("cuCtxSynchronize", api.cuCtxSynchronize());
    }
    printf("barrier ok rounds=%d\n", rounds);
}

static void use_device(int d, int create)
{
    CUdevice dev;
    CUcontext ctx;
    check("cuDeviceGet", api.cuDeviceGet(&dev, d));
    if (create) {
        check("cuCtxCreate", api.cuCtxCreate_v2(&ctx, 0, dev));
    } else {
        check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&ctx, dev));
        check("cuCtxSetCurrent", api.cuCtxSetCurrent(ctx));
    }
}

static void launch(unsigned long long us, int n)
{
    CUfunction f = sleep_fn();
    void *params[] = {&us};
    for (int i = 0; i < n; i++)
        check("cuLaunchKernel", api.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
}

/* K kernels of US, each after HOSTUS of host work (none: launched at once), then a synchronise: a
 * training's step, a server's request (or one token of it). */
static void step(unsigned long long us, int k, unsigned long long host_us)
{
    for (int j = 0; j < k; j++) {
        if (host_us)
            usleep((useconds_t)host_us);
        launch(us, 1);
    }
    check("cuCtxSynchronize", api.cuCtxSynchronize());
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double mean_of(const double *v, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    return n ? sum / n : 0;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n ? v[n / 2] : 0;
}

#define MAX_ALLOCS 256
static CUdeviceptr allocs[MAX_ALLOCS];
static int n_allocs;

struct thread_job { int dev; unsigned long long us; int n; pthread_t tid; };
static struct thread_job threads[8];
static int n_threads;

static void *thread_main(void *arg)
{
    struct thread_job *j = arg;
    use_device(j->dev, 0);
    launch(j->us, j->n);
    check("cuCtxSynchronize", api.cuCtxSynchronize());
    return NULL;
}

static void run(char *action);

/* The bytes [off, off + n) of round `round`'s pattern: different on every page and every round. */
static void pattern_fill(unsigned char *buf, size_t off, size_t n, unsigned seed, int round)
{
    for (size_t j = 0; j < n; j++) {
        size_t i = off + j;
        buf[j] = i % 4096 ? (unsigned char)(i ^ (size_t)round)
                          : (unsigned char)(seed + (unsigned)round * 31u + (unsigned)(i >> 12));
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int first = 1;
    if (argc > 1 && strncmp(argv[1], "--via=", 6) == 0) {
        route = argv[1] + 6;
        first = 2;
    }
    resolve();
    for (int i = first; i < argc; i++)
        run(argv[i]);
    printf("done\n");
    return 0;
}

/* Direct calls of the actions below. */
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuCtxEnablePeerAccess(CUcontext, unsigned int);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
CUresult cuGreenCtxCreate(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
static CUarray arrays[64];
static int n_arrays;
CUresult cuGreenCtxStreamCreate(CUstream *, CUgreenCtx, unsigned int, int);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);

static CUdeviceptr async_allocs[MAX_ALLOCS];
static int n_async;
struct vm_kept { CUdeviceptr va; size_t size; };
static struct vm_kept vm_kept[64];
static int n_vm_kept;

/* What cudaMalloc would give: pinned memory on dev. */
static CUmemAllocationProp device_memory(CUdevice dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static CUmemoryPool current_pool(void)
{
    CUdevice dev;
    CUmemoryPool pool;
    check("cuCtxGetDevice", cuCtxGetDevice(&dev));
    check("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool(&pool, dev));
    return pool;
}

/* 1 when the action was one of these. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
static CUdeviceptr ipc_local, ipc_remote;
static size_t ipc_bytes;

/* 1 when every byte of [p, p + n) on the device is `want`. */
static int device_bytes_are(CUdeviceptr p, size_t n, unsigned char want, unsigned char *seen)
{
    unsigned char *buf = malloc(n);
    int same = buf && api.cuMemcpyDtoH_v2(buf, p, n) == CUDA_SUCCESS;
    for (size_t i = 0; same && i < n; i++)
        same = buf[i] == want;
    if (seen && buf)
        *seen = buf[n - 1];
    free(buf);
    return same;
}

static int read_handle(const char *path, CUipcMemHandle *h, int wait_ms)
{
    for (int waited = 0;; waited += 10) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t n = fread(h, 1, sizeof *h, f);
            fclose(f);
            if (n == sizeof *h)
                return 0;
        }
        if (waited >= wait_ms)
            return -1;
        usleep(10000);
    }
}

static int run_ipc(const char *action, char *arg)
{
    if (strcmp(action, "ipcput") == 0) {
        char *path = strchr(arg, ':');
        ipc_bytes = strtoull(arg, NULL, 10);
        CUresult rc = api.cuMemAlloc_v2(&ipc_local, ipc_bytes);
        if (rc == CUDA_SUCCESS)
            rc = cuMemsetD8_v2(ipc_local, 0xa1, ipc_bytes);
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        if (rc == CUDA_SUCCESS)
            rc = cuIpcGetMemHandle(&h, ipc_local + ipc_bytes / 2);
        if (rc == CUDA_SUCCESS && path) {
            char tmp[4200];
            snprintf(tmp, sizeof tmp, "%s.tmp", path + 1);
            FILE *f = fopen(tmp, "wb");
            fwrite(&h, 1, sizeof h, f);
            fclose(f);
            rename(tmp, path + 1);
        }
        printf("ipcput rc=%d\n", rc);
    } else if (strcmp(action, "ipcwait") == 0) {
        char *ms = strchr(arg, ':');
        unsigned char want = (unsigned char)strtoul(arg, NULL, 16), seen = 0;
        int limit = ms ? atoi(ms + 1) : 10000, ok = 0;
        for (int waited = 0; !ok && waited <= limit; waited += 20) {
            ok = device_bytes_are(ipc_local + ipc_bytes / 2, ipc_bytes - ipc_bytes / 2, want, &seen);
            if (!ok)
                usleep(20000);
        }
        int first_half = device_bytes_are(ipc_local, ipc_bytes / 2, 0xa1, NULL);
        printf("ipcwait %s first_half=%s\n", ok ? "ok" : "timeout", first_half ? "intact" : "changed");
        if (!ok)
            printf("ipcwait saw 0x%x\n", seen);
    } else if (strcmp(action, "ipcget") == 0) {
        char *bytes = strchr(arg, ':');
        if (bytes)
            *bytes++ = '\0';
        ipc_bytes = bytes ? strtoull(bytes, NULL, 10) : 0;
        CUipcMemHandle h;
        if (read_handle(arg, &h, 20000) != 0) {
            printf("ipcget no handle\n");
            return 1;
        }
        CUresult rc = cuIpcOpenMemHandle_v2(&ipc_remote, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        printf("ipcget rc=%d\n", rc);
        if (rc != CUDA_SUCCESS)
            return 1;
        printf("ipcget read %s\n", device_bytes_are(ipc_remote, ipc_bytes / 2, 0xa1, NULL) ? "ok" : "wrong");
        check("cuMemsetD8", cuMemsetD8_v2(ipc_remote + ipc_bytes / 2, 0xb2, ipc_bytes - ipc_bytes / 2));
        check("cuCtxSynchronize", api.cuCtxSynchronize());
    } else if (strcmp(action, "ipcclose") == 0) {
        printf("ipcclose rc=%d\n", cuIpcCloseMemHandle(ipc_remote));
    } else if (strcmp(action, "ipcraw") == 0) {
        char *hex = strchr(arg, ':');
        if (hex)
            *hex++ = '\0';
        CUipcMemHandle h;
        if (read_handle(arg, &h, 0) != 0) {
            printf("ipcraw no handle\n");
            return 1;
        }
        if (hex && *hex)
            memset(h.reserved + 8, (int)strtoul(hex, NULL, 16), sizeof h.reserved - 8);
        CUdeviceptr p = 0;
        printf("ipcraw rc=%d\n", cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    } else {
        return 0;
    }
    return 1;
}

CUresult cuMemcpyPeer(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *);
CUresult cuCtxGetCurrent(CUcontext *);

static void peer_copies(char *arg, int three_d)
{
    char *bytes = strchr(arg, ':');
    char *count = bytes ? strchr(bytes + 1, ':') : NULL;
    size_t n = bytes ? strtoull(bytes + 1, NULL, 10) : 4096;
    int rounds = count ? atoi(count + 1) : 1;
    CUcontext here, there;
    CUdevice peer;
    CUdeviceptr src, dst;
    check("cuCtxGetCurrent", cuCtxGetCurrent(&here));
    check("cuDeviceGet", api.cuDeviceGet(&peer, atoi(arg)));
    check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&there, peer));
    check("cuMemAlloc", api.cuMemAlloc_v2(&src, n));
    check("cuCtxSetCurrent", api.cuCtxSetCurrent(there));
    check("cuMemAlloc", api.cuMemAlloc_v2(&dst, n));
    check("cuCtxSetCurrent", api.cuCtxSetCurrent(here));
    unsigned char *want = malloc(n), *got = malloc(n);
    int ok = 1;
    for (int r = 0; r < rounds && ok; r++) {
        memset(want, 0x30 + r, n);
        check("cuMemcpyHtoD", api.cuMemcpyHtoD_v2(src, want, n));
        CUDA_MEMCPY3D_PEER p;
        memset(&p, 0, sizeof p);
        p.srcMemoryType = p.dstMemoryType = 2;  /* CU_MEMORYTYPE_DEVICE */
        p.srcDevice = src;
        p.srcContext = here;
        p.dstDevice = dst;
        p.dstContext = there;
        p.WidthInBytes = n;
        p.Height = p.Depth = 1;
        CUresult rc = three_d ? cuMemcpy3DPeer(&p) : cuMemcpyPeer(dst, there, src, here, n);
        check("cuCtxSetCurrent", api.cuCtxSetCurrent(there));
        check("cuMemcpyDtoH", api.cuMemcpyDtoH_v2(got, dst, n));
        check("cuCtxSetCurrent", api.cuCtxSetCurrent(here));
        ok = rc == CUDA_SUCCESS && memcmp(got, want, n) == 0;
    }
    printf("peercopy%s %s rounds=%d\n", three_d ? "3d" : "", ok ? "ok" : "wrong", rounds);
    free(want);
    free(got);
}

/* A 3D peer copy from an array on the current device, whose srcContext still names device D's
 * context (left from an earlier copy): the driver ignores the context of an array side. */
static void peer_copy_from_array(char *arg)
{
    CUcontext here, there;
    CUdevice peer;
    CUdeviceptr dst;
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {64, 1, CU_AD_FORMAT_FLOAT, 4};
    check("cuCtxGetCurrent", cuCtxGetCurrent(&here));
    check("cuDeviceGet", api.cuDeviceGet(&peer, atoi(arg)));
    check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&there, peer));
    check("cuCtxSetCurrent", api.cuCtxSetCurrent(here));
    check("cuArrayCreate", cuArrayCreate_v2(&a, &d));
    check("cuMemAlloc", api.cuMemAlloc_v2(&dst, 64 * 16));
    CUDA_MEMCPY3D_PEER p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = 3;  /* CU_MEMORYTYPE_ARRAY */
    p.srcArray = a;
    p.srcContext = there;
    p.dstMemoryType = 2;  /* CU_MEMORYTYPE_DEVICE */
    p.dstDevice = dst;
    p.dstContext = here;
    p.WidthInBytes = 64 * 16;
    p.Height = p.Depth = 1;
    printf("peercopy3darray rc=%d\n", cuMemcpy3DPeer(&p));
}

static pthread_barrier_t race_start;

static void *race_main(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&race_start);
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    int failed = api.cuInit(0) != CUDA_SUCCESS || api.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
                 api.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || api.cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
                 api.cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS || api.cuMemFree_v2(p) != CUDA_SUCCESS;
    return (void *)(intptr_t)failed;
}

struct grow_job { int n; CUdeviceptr *ptrs; int failed; atomic_int done; CUcontext ctx; };

static void *grow_main(void *arg)
{
    struct grow_job *j = arg;
    check("cuCtxSetCurrent", api.cuCtxSetCurrent(j->ctx));
    for (int i = 0; i < j->n; i++)
        j->failed += api.cuMemAlloc_v2(&j->ptrs[i], 1024) != CUDA_SUCCESS;
    atomic_store(&j->done, 1);
    return NULL;
}

static void fork_while_growing(char *arg)
{
    char *forks_text = strchr(arg, ':');
    struct grow_job job = {atoi(arg), NULL, 0, 0, NULL};
    check("cuCtxGetCurrent", cuCtxGetCurrent(&job.ctx));
    int forks = forks_text ? atoi(forks_text + 1) : 20, children_failed = 0, forked = 0;
    job.ptrs = calloc((size_t)job.n, sizeof *job.ptrs);
    pthread_t grower;
    pthread_create(&grower, NULL, grow_main, &job);
    while (forked < forks) {
        pid_t child = fork();
        if (child == 0)
            _exit(0);  /* the hook's fork handlers ran in it: a double free would have aborted it */
        int status = 0;
        waitpid(child, &status, 0);
        children_failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        forked++;
        if (atomic_load(&job.done))
            break;
    }
    pthread_join(grower, NULL);
    int free_failed = 0;
    for (int i = 0; i < job.n; i++)
        free_failed += job.ptrs[i] && api.cuMemFree_v2(job.ptrs[i]) != CUDA_SUCCESS;
    free(job.ptrs);
    printf("forkgrow allocs=%d forks=%d children_failed=%d alloc_failed=%d free_failed=%d\n", job.n, forked,
           children_failed, job.failed, free_failed);
}

static int run_more(const char *action, char *arg)
{
    if (strcmp(action, "initrace") == 0) {
        int n = atoi(arg), failed = 0;
        pthread_t tids[64];
        n = n > 64 ? 64 : n;
        pthread_barrier_init(&race_start, NULL, (unsigned)n);
        for (int i = 0; i < n; i++)
            pthread_create(&tids[i], NULL, race_main, NULL);
        for (int i = 0; i < n; i++) {
            void *r;
            pthread_join(tids[i], &r);
            failed += (int)(intptr_t)r;
        }
        printf("initrace threads=%d failed=%d\n", n, failed);
        return 1;
    }
    if (strcmp(action, "forkgrow") == 0) {
        fork_while_growing(arg);
        return 1;
    }
    if (strcmp(action, "peercopy") == 0 || strcmp(action, "peercopy3d") == 0) {
        peer_copies(arg, action[8] == '3');
        return 1;
    }
    if (strcmp(action, "peercopy3darray") == 0) {
        peer_copy_from_array(arg);
        return 1;
    }
    if (strncmp(action, "ipc", 3) == 0)
        return run_ipc(action, arg);
    if (strcmp(action, "fill") == 0 || strcmp(action, "check") == 0) {
        /* fill:I:HEX / check:I:HEX: every byte of the I-th live allocation set to / compared with HEX */
        char *h = strchr(arg, ':');
        int i = atoi(arg), byte = h ? (int)strtol(h + 1, NULL, 16) : 0;
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult rc = i < n_allocs ? cuMemGetAddressRange_v2(&base, &size, allocs[i]) : CUDA_ERROR_INVALID_VALUE;
        enum { PIECE = 4 << 20 };
        unsigned char *buf = malloc(PIECE);
        size_t bad = 0;
        for (size_t off = 0; rc == CUDA_SUCCESS && buf && off < size; off += PIECE) {
            size_t n = size - off < PIECE ? size - off : PIECE;
            if (action[0] == 'f') {
                memset(buf, byte, n);
                rc = api.cuMemcpyHtoD_v2(base + off, buf, n);
                continue;
            }
            rc = api.cuMemcpyDtoH_v2(buf, base + off, n);
            for (size_t k = 0; rc == CUDA_SUCCESS && k < n; k++)
                bad += buf[k] != (unsigned char)byte;
        }
        free(buf);
        printf("%s %d rc=%d bytes=%zu bad=%zu\n", action, i, rc, size, bad);
        return 1;
    }
    if (strcmp(action, "waitfile") == 0) {
        /* waitfile:PATH: until PATH exists (at most 120 s), so a test can act between two steps */
        int waited = 0;
        for (; access(arg, F_OK) != 0 && waited < 120000; waited += 10)
            usleep(10000);
        printf("waitfile %s\n", access(arg, F_OK) == 0 ? "ok" : "timeout");
        return 1;
    }
    if (strcmp(action, "capture") == 0) {
        char *n = strchr(arg, ':');
        char *hold = n ? strchr(n + 1, ':') : NULL;
        unsigned long long us = strtoull(arg, NULL, 10);
        int count = n ? atoi(n + 1) : 1;
        CUstream s;
        check("cuStreamCreate", cuStreamCreate(&s, 0));
        check("cuStreamBeginCapture", cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        void *params[] = {&us};
        for (int i = 0; i < count; i++)
            check("cuLaunchKernel", api.cuLaunchKernel(sleep_fn(), 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        if (hold)
            usleep((useconds_t)atoi(hold + 1) * 1000);
        CUgraph graph = NULL;
        CUresult rc = cuStreamEndCapture(s, &graph);
        if (rc != CUDA_SUCCESS) {
            printf("capture rc=%d\n", rc);
            return 1;
        }
        CUgraphExec exec;
        check("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags(&exec, graph, 0));
        check("cuGraphLaunch", cuGraphLaunch(exec, s));
        check("cuStreamSynchronize", cuStreamSynchronize(s));
        printf("capture rc=0 replayed\n");
    } else if (strcmp(action, "asyncalloc") == 0) {
        CUdeviceptr p = 0;
        CUresult rc = cuMemAllocAsync(&p, strtoull(arg, NULL, 10), NULL);
        if (rc == CUDA_SUCCESS && n_async < MAX_ALLOCS)
            async_allocs[n_async++] = p;
        printf("asyncalloc %s rc=%d\n", arg, rc);
    } else if (strcmp(action, "asyncfreeall") == 0) {
        for (int i = 0; i < n_async; i++)
            check("cuMemFreeAsync", cuMemFreeAsync(async_allocs[i], NULL));
        n_async = 0;
        printf("asyncfreeall ok\n");
    } else if (strcmp(action, "poolkeep") == 0) {
        cuuint64_t keep = ~0ull;
        check("cuMemPoolSetAttribute", cuMemPoolSetAttribute(current_pool(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
        printf("poolkeep ok\n");
    } else if (strcmp(action, "pooltrim") == 0) {
        check("cuMemPoolTrimTo", cuMemPoolTrimTo(current_pool(), 0));
        printf("pooltrim ok\n");
    } else if (strcmp(action, "vmkeep") == 0) {
        size_t size = strtoull(arg, NULL, 10);
        CUdevice dev;
        check("cuCtxGetDevice", cuCtxGetDevice(&dev));
        CUmemAllocationProp prop = device_memory(dev);
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        check("cuMemCreate", api.cuMemCreate(&h, size, &prop, 0));
        check("cuMemAddressReserve", api.cuMemAddressReserve(&va, size, 0, 0, 0));
        check("cuMemMap", api.cuMemMap(va, size, 0, h, 0));
        check("cuMemRelease", api.cuMemRelease(h));  /* the mapping keeps the memory */
        if (n_vm_kept < 64)
            vm_kept[n_vm_kept++] = (struct vm_kept){va, size};
        printf("vmkeep ok\n");
    } else if (strcmp(action, "vmdrop") == 0) {
        for (int i = 0; i < n_vm_kept; i++) {
            check("cuMemUnmap", api.cuMemUnmap(vm_kept[i].va, vm_kept[i].size));
            check("cuMemAddressFree", api.cuMemAddressFree(vm_kept[i].va, vm_kept[i].size));
        }
        n_vm_kept = 0;
        printf("vmdrop ok\n");
    } else if (strcmp(action, "totalmem") == 0) {
        CUdevice dev;
        size_t total = 0;
        check("cuCtxGetDevice", cuCtxGetDevice(&dev));
        check("cuDeviceTotalMem", cuDeviceTotalMem_v2(&total, dev));
        printf("totalmem %zu\n", total);
    } else if (strcmp(action, "stamp") == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        printf("stamp %llu\n", (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    } else if (strcmp(action, "peer") == 0) {
        CUdevice dev;
        CUcontext peer;
        check("cuDeviceGet", api.cuDeviceGet(&dev, atoi(arg)));
        check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&peer, dev));
        check("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess(peer, 0));
        printf("peer %s ok\n", arg);
    } else if (strcmp(action, "range") == 0) {
        char *off = strchr(arg, ':');
        size_t size = strtoull(arg, NULL, 10), offset = off ? strtoull(off + 1, NULL, 10) : 0;
        CUdeviceptr p, base = 0, start = 0;
        size_t got = 0, attr_size = 0;
        check("cuMemAlloc", api.cuMemAlloc_v2(&p, size));
        CUresult rc = cuMemGetAddressRange_v2(&base, &got, p + offset);
        CUresult rc2 = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + offset);
        if (rc2 == CUDA_SUCCESS)
            rc2 = cuPointerGetAttribute(&attr_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + offset);
        printf("range rc=%d base_off=%lld size=%zu attr rc=%d base_off=%lld size=%zu\n", rc,
               (long long)(base - p), got, rc2, (long long)(start - p), attr_size);
        check("cuMemFree", api.cuMemFree_v2(p));
    } else if (strcmp(action, "greenlaunch") == 0) {
        unsigned long long us = strtoull(arg, NULL, 10);
        CUdevice dev;
        CUgreenCtx green;
        CUstream s;
        check("cuCtxGetDevice", cuCtxGetDevice(&dev));
        check("cuGreenCtxCreate", cuGreenCtxCreate(&green, NULL, dev, 0));
        check("cuGreenCtxStreamCreate", cuGreenCtxStreamCreate(&s, green, 0, 0));
        void *params[] = {&us};
        check("cuLaunchKernel", api.cuLaunchKernel(sleep_fn(), 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        printf("greenlaunch ok\n");
    } else if (strcmp(action, "array") == 0) {
        char *h = strchr(arg, ':');
        CUDA_ARRAY_DESCRIPTOR d = {strtoull(arg, NULL, 10), h ? strtoull(h + 1, NULL, 10) : 0, CU_AD_FORMAT_FLOAT, 4};
        CUarray a;
        CUresult rc = cuArrayCreate_v2(&a, &d);
        if (rc == CUDA_SUCCESS && n_arrays < 64)
            arrays[n_arrays++] = a;
        printf("array rc=%d\n", rc);
    } else if (strcmp(action, "arrayfree") == 0) {
        for (int i = 0; i < n_arrays; i++)
            check("cuArrayDestroy", cuArrayDestroy(arrays[i]));
        n_arrays = 0;
        printf("arrayfree ok\n");
    } else if (strcmp(action, "manyctx") == 0) {
        char *n = strchr(arg, ':');
        int count = n ? atoi(n + 1) : 1;
        CUdevice dev;
        CUcontext ctx, popped;
        extern CUresult cuCtxPopCurrent_v2(CUcontext *);
        check("cuDeviceGet", api.cuDeviceGet(&dev, atoi(arg)));
        for (int i = 0; i < count; i++) {
            check("cuCtxCreate", api.cuCtxCreate_v2(&ctx, 0, dev));
            if (i + 1 < count)
                check("cuCtxPopCurrent", cuCtxPopCurrent_v2(&popped));
        }
        printf("manyctx %d ok\n", count);
    } else if (strcmp(action, "reset") == 0) {
        CUdevice dev;
        check("cuDeviceGet", api.cuDeviceGet(&dev, atoi(arg)));
        check("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2(dev));
        printf("reset %s ok\n", arg);
    } else {
        return 0;
    }
    return 1;
}

static void run(char *action)
{
    char *arg = strchr(action, ':');
    if (arg)
        *arg++ = '\0';
    if (run_more(action, arg))
        return;
    if (strcmp(action, "init") == 0) {
        check("cuInit", api.cuInit(0));
        printf("init ok\n");
    } else if (strcmp(action, "count") == 0) {
        int n = -1;
        check("cuDeviceGetCount", cuDeviceGetCount(&n));
        printf("count %d\n", n);
    } else if (strcmp(action, "open") == 0 || strcmp(action, "fopen") == 0) {
        /* open:PATH / fopen:PATH: a device file opened as NVML does, without the CUDA API */
        int fd = -1;
        FILE *f = NULL;
        if (action[0] == 'f')
            f = fopen(arg, "r+e");
        else
            fd = open(arg, O_RDWR | O_CLOEXEC);
        int err = errno;
        int cloexec = f ? fcntl(fileno(f), F_GETFD) & FD_CLOEXEC : fd >= 0 ? fcntl(fd, F_GETFD) & FD_CLOEXEC : 0;
        if (fd >= 0 || f)
            printf("%s %s ok cloexec=%d\n", action, arg, cloexec ? 1 : 0);
        else
            printf("%s %s errno=%d\n", action, arg, err);
        if (f)
            fclose(f);
        if (fd >= 0)
            close(fd);
    } else if (strcmp(action, "ctx") == 0 || strcmp(action, "newctx") == 0) {
        use_device(atoi(arg), action[0] == 'n');
        printf("%s %s ok\n", action, arg);
    } else if (strcmp(action, "launch") == 0) {
        char *n = strchr(arg, ':');
        launch(strtoull(arg, NULL, 10), n ? atoi(n + 1) : 1);
        printf("launch ok\n");
    } else if (strcmp(action, "launchex") == 0) {
        unsigned long long us = strtoull(arg, NULL, 10);
        void *params[] = {&us};
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
        check("cuLaunchKernelEx", api.cuLaunchKernelEx(&cfg, sleep_fn(), params, NULL));
        printf("launchex ok\n");
    } else if (strcmp(action, "burst") == 0) {
        /* burst:US:N:GAPMS: N rounds of (one kernel of US, synchronise, GAPMS of host work) */
        char *n = strchr(arg, ':');
        char *gap = n ? strchr(n + 1, ':') : NULL;
        int rounds = n ? atoi(n + 1) : 1;
        for (int i = 0; i < rounds; i++) {
            launch(strtoull(arg, NULL, 10), 1);
            check("cuCtxSynchronize", api.cuCtxSynchronize());
            if (gap)
                usleep((useconds_t)atoi(gap + 1) * 1000);
        }
        printf("burst ok\n");
    } else if (strcmp(action, "serve") == 0) {
        /* serve:US:K:N:MEANMS:SEED[:HOSTUS[:TOKENS]]: N requests arriving at random (mean MEANMS apart),
         * each K kernels of US and a synchronise; with HOSTUS, that much host work before each kernel
         * (a server bound by its host's launches); with TOKENS, a request is that many such rounds, each
         * after HOSTUS more (model.generate's tokens, each ended by a synchronise). */
        unsigned long long us = 1000, seed = 1, host_us = 0;
        int k = 1, requests = 1, mean_ms = 30, tokens = 1;
        sscanf(arg, "%llu:%d:%d:%d:%llu:%llu:%d", &us, &k, &requests, &mean_ms, &seed, &host_us, &tokens);
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1, next = now_ns();
        for (int i = 0; i < requests; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;   /* xorshift64: uniform in (0, 1] below */
            double u = (double)((x >> 11) + 1) / 9007199254740992.0;
            next += (uint64_t)(-log(u) * mean_ms * 1e6);
            uint64_t t = now_ns();
            if (next > t)
                usleep((useconds_t)((next - t) / 1000));
            for (int t = 0; t < tokens; t++) {
                if (t && host_us)
                    usleep((useconds_t)host_us);
                step(us, k, host_us);
            }
        }
        printf("serve ok\n");
    } else if (strcmp(action, "train") == 0) {
        /* train:US:K:N:HOSTUS:PAUSEMS: N steps as a PyTorch training makes them: K kernels of US
         * launched one after the other with HOSTUS of host work before each (the host runs ahead of
         * the GPU when K x HOSTUS < K x US), one synchronise, then PAUSEMS of host work. */
        unsigned long long us = strtoull(arg, NULL, 10), host_us = 0;
        int k = 1, steps = 1, pause_ms = 0;
        sscanf(arg, "%llu:%d:%d:%llu:%d", &us, &k, &steps, &host_us, &pause_ms);
        for (int i = 0; i < steps; i++) {
            step(us, k, host_us);
            if (pause_ms)
                usleep((useconds_t)pause_ms * 1000);
        }
        printf("train ok\n");
    } else if (strcmp(action, "copytrain") == 0) {
        /* copytrain:US:K:N: N steps as a PyTorch training's: its batch copied in (cuMemcpyHtoDAsync_v2),
         * K kernels of US launched at once, its loss copied out (cuMemcpyDtoHAsync_v2) and its stream
         * synchronised (.item()), all on the legacy stream. */
        unsigned long long us = strtoull(arg, NULL, 10);
        int k = 1, steps = 1;
        sscanf(arg, "%llu:%d:%d", &us, &k, &steps);
        static char batch[4096];
        float loss = 0;
        CUdeviceptr d = 0;
        check("cuMemAlloc", api.cuMemAlloc_v2(&d, sizeof batch));
        for (int i = 0; i < steps; i++) {
            check("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2(d, batch, sizeof batch, NULL));
            launch(us, k);
            check("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2(&loss, d, sizeof loss, NULL));
            check("cuStreamSynchronize", cuStreamSynchronize(NULL));
        }
        printf("copytrain ok\n");
    } else if (strcmp(action, "mixtrain") == 0) {
        /* mixtrain:SHORT_US:K:LONG_US:L:N: N steps of K short kernels then L long ones, launched at
         * once, one synchronise: a training whose few long kernels (GEMMs) hide among many short ones
         * (elementwise). The long ones are launched with a grid of 2 blocks, the short with 1: one
         * kernel at two shapes, as cuBLAS's kernels run at several. */
        unsigned long long us = 20, long_us = 2000;
        int k = 1, l = 1, steps = 1;
        sscanf(arg, "%llu:%d:%llu:%d:%d", &us, &k, &long_us, &l, &steps);
        CUfunction f = sleep_fn();
        for (int i = 0; i < steps; i++) {
            for (int j = 0; j < k + l; j++) {
                unsigned long long t = j < k ? us : long_us;
                void *params[] = {&t};
                check("cuLaunchKernel", api.cuLaunchKernel(f, j < k ? 1 : 2, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
            }
            check("cuCtxSynchronize", api.cuCtxSynchronize());
        }
        printf("mixtrain ok\n");
    } else if (strcmp(action, "sync") == 0) {
        check("cuCtxSynchronize", api.cuCtxSynchronize());
        printf("sync ok\n");
    } else if (strcmp(action, "alloc") == 0) {
        CUdeviceptr p = 0;
        CUresult rc = api.cuMemAlloc_v2(&p, strtoull(arg, NULL, 10));
        if (rc == CUDA_SUCCESS && n_allocs < MAX_ALLOCS)
            allocs[n_allocs++] = p;
        printf("alloc %s rc=%d\n", arg, rc);
    } else if (strcmp(action, "allocfree") == 0) {
        /* allocfree:BYTES:N: N times cuMemAlloc_v2 of BYTES, then its cuMemFree_v2, each call timed;
         * one line: BYTES N, then the mean and median ns of the allocations and of the frees */
        char *n = strchr(arg, ':');
        int count = n && atoi(n + 1) > 0 ? atoi(n + 1) : 1;
        size_t bytes = strtoull(arg, NULL, 10);
        double *alloc_ns = calloc((size_t)count, sizeof *alloc_ns), *free_ns = calloc((size_t)count, sizeof *free_ns);
        CUresult rc = alloc_ns && free_ns ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        for (int i = 0; i < count && rc == CUDA_SUCCESS; i++) {
            CUdeviceptr p = 0;
            uint64_t t0 = now_ns();
            rc = api.cuMemAlloc_v2(&p, bytes);
            uint64_t t1 = now_ns();
            if (rc == CUDA_SUCCESS)
                rc = api.cuMemFree_v2(p);
            alloc_ns[i] = (double)(t1 - t0);
            free_ns[i] = (double)(now_ns() - t1);
        }
        printf("allocfree %zu %d %.0f %.0f %.0f %.0f rc=%d\n", bytes, count, mean_of(alloc_ns, count),
               median_of(alloc_ns, count), mean_of(free_ns, count), median_of(free_ns, count), rc);
        free(alloc_ns);
        free(free_ns);
    } else if (strcmp(action, "allocpitch") == 0) {
        char *h = strchr(arg, ':');
        CUdeviceptr p = 0;
        size_t pitch = 0;
        CUresult rc = api.cuMemAllocPitch_v2(&p, &pitch, strtoull(arg, NULL, 10), h ? strtoull(h + 1, NULL, 10) : 1, 4);
        if (rc == CUDA_SUCCESS && n_allocs < MAX_ALLOCS)
            allocs[n_allocs++] = p;
        printf("allocpitch rc=%d pitch=%zu\n", rc, pitch);
    } else if (strcmp(action, "free") == 0) {
        /* free:I: the I-th allocation, kept in the list when the free fails (it can be retried) */
        int i = atoi(arg);
        CUresult rc = i < n_allocs ? api.cuMemFree_v2(allocs[i]) : CUDA_ERROR_INVALID_VALUE;
        if (rc == CUDA_SUCCESS) {
            for (int k = i + 1; k < n_allocs; k++)
                allocs[k - 1] = allocs[k];
            n_allocs--;
        }
        printf("free rc=%d\n", rc);
    } else if (strcmp(action, "freeall") == 0) {
        for (int i = 0; i < n_allocs; i++)
            check("cuMemFree", api.cuMemFree_v2(allocs[i]));
        n_allocs = 0;
        printf("freeall ok\n");
    } else if (strcmp(action, "meminfo") == 0) {
        size_t f = 0, t = 0;
        check("cuMemGetInfo", api.cuMemGetInfo_v2(&f, &t));
        printf("meminfo free=%zu total=%zu\n", f, t);
    } else if (strcmp(action, "copy") == 0) {
        char out[4096], in[4096];
        for (size_t i = 0; i < sizeof out; i++)
            out[i] = (char)(i * 7);
        CUdeviceptr p;
        check("cuMemAlloc", api.cuMemAlloc_v2(&p, sizeof out));
        check("cuMemcpyHtoD", api.cuMemcpyHtoD_v2(p, out, sizeof out));
        check("cuMemcpyDtoH", api.cuMemcpyDtoH_v2(in, p, sizeof in));
        check("cuMemFree", api.cuMemFree_v2(p));
        printf("copy %s\n", memcmp(in, out, sizeof in) == 0 ? "ok" : "mismatch");
    } else if (strcmp(action, "vm") == 0) {
        size_t size = strtoull(arg, NULL, 10);
        CUdevice dev;
        CUcontext cur;
        extern CUresult cuCtxGetDevice(CUdevice *);
        extern CUresult cuCtxGetCurrent(CUcontext *);
        (void)cur;
        check("cuCtxGetDevice", cuCtxGetDevice(&dev));
        CUmemAllocationProp prop = device_memory(dev);
        CUmemGenericAllocationHandle h;
        CUresult rc = api.cuMemCreate(&h, size, &prop, 0);
        if (rc != CUDA_SUCCESS) {
            printf("vm rc=%d\n", rc);
            return;
        }
        CUdeviceptr va;
        check("cuMemAddressReserve", api.cuMemAddressReserve(&va, size, 0, 0, 0));
        check("cuMemMap", api.cuMemMap(va, size, 0, h, 0));
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        check("cuMemSetAccess", api.cuMemSetAccess(va, size, &access, 1));
        char msg[] = "held in virtual memory";
        check("cuMemcpyHtoD", api.cuMemcpyHtoD_v2(va, msg, sizeof msg));
        check("cuMemUnmap", api.cuMemUnmap(va, size));
        check("cuMemMap", api.cuMemMap(va, size, 0, h, 0));
        check("cuMemSetAccess", api.cuMemSetAccess(va, size, &access, 1));
        char back[sizeof msg];
        check("cuMemcpyDtoH", api.cuMemcpyDtoH_v2(back, va, sizeof back));
        size_t f, t;
        check("cuMemGetInfo", api.cuMemGetInfo_v2(&f, &t));
        printf("vm mapped free=%zu\n", f);
        check("cuMemUnmap", api.cuMemUnmap(va, size));
        check("cuMemRelease", api.cuMemRelease(h));
        check("cuMemAddressFree", api.cuMemAddressFree(va, size));
        printf("vm rc=0 %s\n", memcmp(back, msg, sizeof msg) == 0 ? "data ok" : "data lost");
    } else if (strcmp(action, "pattern") == 0) {
        char *r = strchr(arg, ':');
        char *us = r ? strchr(r + 1, ':') : NULL;
        /* pattern:BYTES:ROUNDS:KERNEL_US:PATH holds the memory until PATH exists, then checks the last
         * round's data once more before freeing it: a test can make sure the allocation lived
         * through what it was waiting for (another job's turn, a swap-out). */
        char *hold = us ? strchr(us + 1, ':') : NULL;
        size_t size = strtoull(arg, NULL, 10);
        int rounds = r ? atoi(r + 1) : 1;
        unsigned long long kernel_us = us ? strtoull(us + 1, NULL, 10) : 1000;
        /* Checked and rewritten in pieces, so the program's own memory stays small. */
        enum { PIECE = 8 << 20 };
        unsigned char *want = malloc(PIECE), *got = malloc(PIECE);
        CUdeviceptr p = 0;
        CUresult rc = api.cuMemAlloc_v2(&p, size);
        if (rc != CUDA_SUCCESS || !want || !got) {
            printf("pattern alloc rc=%d\n", rc);
            return;
        }
        unsigned seed = (unsigned)getpid();
        for (int round = 0; round <= rounds; round++) {
            if (round > 0)
                launch(kernel_us, 1);
            for (size_t off = 0; off < size; off += PIECE) {
                size_t n = size - off < PIECE ? size - off : PIECE;
                if (round > 0) {
                    pattern_fill(want, off, n, seed, round - 1);
                    check("cuMemcpyDtoH", api.cuMemcpyDtoH_v2(got, p + off, n));
                    if (memcmp(got, want, n) != 0) {
                        size_t at = 0;
                        while (got[at] == want[at])
                            at++;
                        printf("pattern mismatch round %d at byte %zu of %zu\n", round, off + at, size);
                        return;
                    }
                }
                pattern_fill(want, off, n, seed, round);
                check("cuMemcpyHtoD", api.cuMemcpyHtoD_v2(p + off, want, n));
            }
        }
        if (hold) {
            for (int waited = 0; access(hold + 1, F_OK) != 0 && waited < 120000; waited += 20)
                usleep(20000);
            for (size_t off = 0; off < size; off += PIECE) {
                size_t n = size - off < PIECE ? size - off : PIECE;
                pattern_fill(want, off, n, seed, rounds);
                check("cuMemcpyDtoH", api.cuMemcpyDtoH_v2(got, p + off, n));
                if (memcmp(got, want, n) != 0) {
                    printf("pattern mismatch after hold at byte %zu of %zu\n", off, size);
                    return;
                }
            }
            printf("pattern held %s\n", access(hold + 1, F_OK) == 0 ? "ok" : "timeout");
        }
        printf("pattern ok rounds=%d at 0x%llx\n", rounds, (unsigned long long)p);
        check("cuMemFree", api.cuMemFree_v2(p));
        free(want);
        free(got);
    } else if (strcmp(action, "barrier") == 0) {
        collectives(arg);
    } else if (strcmp(action, "tbarrier") == 0 && n_rank_threads < 8) {
        struct rank_thread *t = &rank_threads[n_rank_threads++];
        char *rest = strchr(arg, ':');
        t->dev = atoi(arg);
        snprintf(t->arg, sizeof t->arg, "%s", rest ? rest + 1 : "");
        pthread_create(&t->tid, NULL, rank_main, t);
        printf("tbarrier started\n");
    } else if (strcmp(action, "sleep") == 0) {
        usleep((useconds_t)atoi(arg) * 1000);
        printf("sleep ok\n");
    } else if (strcmp(action, "fork") == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            use_device(0, 0);
            launch(1000, 1);
            check("cuCtxSynchronize", api.cuCtxSynchronize());
            printf("child %d ok\n", (int)getpid());
            fflush(stdout);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("fork child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    } else if (strcmp(action, "thread") == 0) {
        struct thread_job *j = &threads[n_threads++];
        char *us = strchr(arg, ':');
        char *n = us ? strchr(us + 1, ':') : NULL;
        j->dev = atoi(arg);
        j->us = us ? strtoull(us + 1, NULL, 10) : 1000;
        j->n = n ? atoi(n + 1) : 1;
        pthread_create(&j->tid, NULL, thread_main, j);
        printf("thread started\n");
    } else if (strcmp(action, "join") == 0) {
        for (int i = 0; i < n_threads; i++)
            pthread_join(threads[i].tid, NULL);
        n_threads = 0;
        for (int i = 0; i < n_rank_threads; i++)
            pthread_join(rank_threads[i].tid, NULL);
        n_rank_threads = 0;
        printf("join ok\n");
    } else if (strcmp(action, "whois") == 0) {
#define API_WHERE(fn, base) where(base, (void *)api.fn);
        API(API_WHERE)
    } else if (strcmp(action, "procaddr") == 0) {
        /* procaddr:NAME:VERSION:FLAGS through the cuGetProcAddress the route found */
        char *ver = strchr(arg, ':');
        char *fl = ver ? strchr(ver + 1, ':') : NULL;
        if (ver) *ver++ = '\0';
        if (fl) *fl++ = '\0';
        getproc_fn gp = getproc ? getproc : cuGetProcAddress_v2;
        void *fn = NULL;
        CUresult rc = gp(arg, &fn, ver ? atoi(ver) : 12040, fl ? strtoull(fl, NULL, 10) : 0, NULL);
        char label[160];
        snprintf(label, sizeof label, "%s@%s/%s rc=%d", arg, ver ? ver : "12040", fl ? fl : "0", rc);
        where(label, fn);
    } else {
        printf("error unknown action %s\n", action);
        exit(2);
    }
}
