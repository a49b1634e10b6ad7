/* fake_cuda.c: a CUDA driver stand-in for CI, built as tests/c/build/libcuda.so.1.
 *
 * Devices come from FAKE_CUDA_DEVICES ("UUID:16G,UUID:16G"; default: the two GPUs of
 * tests/conftest.py). An entry may name the GPU's device file ("UUID:16G:/path/nvidia0"): like the
 * real driver, cuInit opens it (and each new context opens it again), and a device whose file cannot
 * be opened (a device cgroup denies it) is not listed; cuInit fails with CUDA_ERROR_NO_DEVICE when
 * none is left. FAKE_CUDA_DEVICE_LOG names a file that gets "pid path fd-or-errno" per open. Memory is host-backed with real bookkeeping; the virtual memory calls map
 * memfd pages so data survives unmap/map. A "kernel" is a function named "sleep" (first parameter:
 * unsigned long long microseconds) or "empty": launches are asynchronous per stream, synchronisation
 * sleeps until the stream is done, and every sleep kernel appends "pid uuid start_ns end_ns" to
 * FAKE_CUDA_TRACE, so tests can check who ran on which GPU when.
 * FAKE_CUDA_SHARED_MEMORY names a file that holds each device's used bytes for every process that
 * names it, so device memory runs out across processes as on a real GPU, and what each process holds
 * there: an ended process's memory is released FAKE_CUDA_EXIT_RELEASE_MS after it ends
 * (fake_memory.h), and the fake NVML lists it (FAKE_NVML_FROM_CUDA=1). FAKE_CUDA_NO_VMM=1 makes the
 * devices report no virtual memory management. cuMemHostAlloc touches its pages, as pinning does,
 * so they count against the process's cgroup.
 * A kernel named "barrier" (parameters: unsigned long long microseconds, int ranks, int rank) is an
 * NCCL-like collective: the k-th barrier launch of each rank runs until every rank of the group has
 * launched its k-th one, then for the microseconds. The group is the POSIX shared memory segment
 * named by FAKE_CUDA_BARRIER, so ranks may live in different processes.
 * Virtual memory made with the POSIX fd handle type exports as a real fd and imports in another
 * process (the memfd is shared). FAKE_CUDA_UNMAP_FAIL=N makes the next N cuMemUnmap calls fail.
 * FAKE_CUDA_CREATE_MS=N makes the process's first cuMemCreate of more than 2 MiB take N ms after
 * taking the memory. FAKE_CUDA_SWAP_COPY_MS and FAKE_CUDA_COPY_LOG: slow_copy below.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_subset.h"
#include "fake_memory.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 8
#define CTX_MAGIC 0x43545846

struct fstream {
    struct fctx *ctx;
    uint64_t busy_until;
    int capturing;          /* stream capture (the block "graphs, pools, batches" below) */
    int invalidated;
    uint64_t captured_us;   /* the sleep kernels recorded so far */
};
struct fctx {
    int magic;
    int dev;
    struct fstream def;
    struct fstream *streams[64];
    int n_streams;
};
struct fdev {
    CUuuid uuid;
    char text[64];
    uint64_t total;
    uint64_t own_used;      /* used bytes when no shared file is named */
    uint64_t *used;         /* &own_used, or this device's word in the shared file */
    struct fctx *primary;
    char path[256];         /* the device file, "" when the entry names none */
    int fd;                 /* kept open for the life of the process, as the driver does */
};
struct fmod { int unused; };
struct ffunc { int kind; };  /* 1 sleep, 2 empty */
struct falloc { uint64_t ptr, size; int dev; struct falloc *next; };
/* imported: made from another process's export; that process's memory, not counted here again. */
struct fhandle { int fd; uint64_t size; int dev; int exportable; int imported; };

static struct fdev devs[MAX_DEV];
static int n_devs;
static int initialised;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct falloc *allocs;
static struct falloc *host_allocs;
static int trace_fd = -1;
static struct fake_memory *shared_memory;   /* FAKE_CUDA_SHARED_MEMORY's file, mapped */
static int trace_launch;   /* FAKE_CUDA_TRACE_LAUNCH=1: kernels' lines say when they were launched */
static __thread struct fctx *ctx_stack[16];
static __thread int ctx_depth;
static struct ffunc sleep_func = {1}, empty_func = {2};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    for (;;) {
        uint64_t n = now_ns();
        if (n >= t)
            return;
        uint64_t d = t - n;
        struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (toupper((unsigned char)*end)) {
    case 'K': v *= 1024; break;
    case 'M': v *= 1024.0 * 1024; break;
    case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static int parse_uuid(const char *text, CUuuid *out)
{
    const char *p = text;
    if (strncmp(p, "GPU-", 4) == 0)
        p += 4;
    int n = 0;
    while (*p && n < 16) {
        if (*p == '-') { p++; continue; }
        unsigned v;
        if (sscanf(p, "%2x", &v) != 1)
            return -1;
        out->bytes[n++] = (char)v;
        p += 2;
    }
    return n == 16 ? 0 : -1;
}

/* Opens a device's file as the real driver does (through open(), which a preload may interpose);
 * the descriptor, or -1. Each open is logged to FAKE_CUDA_DEVICE_LOG when it is set. */
static int open_device_file(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    int err = errno;
    const char *log = getenv("FAKE_CUDA_DEVICE_LOG");
    if (log && *log) {
        int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
        if (lfd >= 0) {
            char line[400];
            int n = snprintf(line, sizeof line, "%d %s %d\n", (int)getpid(), path, fd >= 0 ? fd : -err);
            if (n > 0 && write(lfd, line, (size_t)n) < 0)
                n = 0;
            close(lfd);
        }
    }
    errno = err;
    return fd;
}

/* 0, or CUDA_ERROR_NO_DEVICE when entries name device files and none of them opens. */
static CUresult setup_devices(void)
{
    const char *spec = getenv("FAKE_CUDA_DEVICES");
    if (!spec || !*spec)
        spec = "GPU-fa4e0000-0000-0000-0000-000000000000:16G,GPU-fa4e0000-0000-0000-0000-000000000001:16G";
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", spec);
    n_devs = 0;
    int named = 0;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item && n_devs < MAX_DEV;
         item = strtok_r(NULL, ",", &save)) {
        char *size = strchr(item, ':');
        char *path = size ? strchr(size + 1, ':') : NULL;
        uint64_t total = 16ull << 30;
        if (size)
            *size++ = '\0';
        if (path)
            *path++ = '\0';
        if (size && *size)
            total = parse_size(size);
        struct fdev *d = &devs[n_devs];
        memset(d, 0, sizeof *d);
        d->fd = -1;
        if (parse_uuid(item, &d->uuid) != 0)
            continue;
        if (path && *path) {
            named++;
            snprintf(d->path, sizeof d->path, "%s", path);
            d->fd = open_device_file(d->path);
            if (d->fd < 0)
                continue;   /* denied: the process does not see this GPU */
        }
        snprintf(d->text, sizeof d->text, "%s", item);
        d->total = total;
        n_devs++;
    }
    const char *trace = getenv("FAKE_CUDA_TRACE");
    if (trace && *trace)
        trace_fd = open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const char *launch = getenv("FAKE_CUDA_TRACE_LAUNCH");
    trace_launch = launch && !strcmp(launch, "1");
    const char *state = getenv("FAKE_CUDA_SHARED_MEMORY");
    if (state && *state) {
        int fd = open(state, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        size_t len = sizeof(struct fake_memory);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && (st.st_size >= (off_t)len || ftruncate(fd, (off_t)len) == 0)) {
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED)
                shared_memory = p;
        }
        if (fd >= 0)
            close(fd);
    }
    for (int i = 0; i < n_devs; i++)
        devs[i].used = shared_memory ? &shared_memory->used[i] : &devs[i].own_used;
    return named && !n_devs ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

/* Takes size bytes of dev's memory, or fails when they are not free (on every process's count, the
 * memory of ended processes not yet released included: fake_memory.h). */
static int take_device_memory(int dev, uint64_t size)
{
    uint64_t old = __atomic_load_n(devs[dev].used, __ATOMIC_SEQ_CST);
    int reaped = 0;
    for (;;) {
        if (old + size > devs[dev].total) {
            if (!shared_memory || reaped++)
                return -1;
            fake_reap(shared_memory);    /* ended processes whose release is due */
            old = __atomic_load_n(devs[dev].used, __ATOMIC_SEQ_CST);
            continue;
        }
        if (__atomic_compare_exchange_n(devs[dev].used, &old, old + size, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            break;
    }
    struct fake_slot *slot = shared_memory ? fake_own_slot(shared_memory, dev) : NULL;
    if (slot)
        __atomic_fetch_add(&slot->bytes, size, __ATOMIC_SEQ_CST);
    return 0;
}

static void give_device_memory(int dev, uint64_t size)
{
    __atomic_fetch_sub(devs[dev].used, size, __ATOMIC_SEQ_CST);
    struct fake_slot *slot = shared_memory ? fake_own_slot(shared_memory, dev) : NULL;
    if (slot) {   /* a forked child frees what its parent took: never below zero */
        uint64_t had = __atomic_load_n(&slot->bytes, __ATOMIC_SEQ_CST);
        __atomic_store_n(&slot->bytes, had > size ? had - size : 0, __ATOMIC_SEQ_CST);
    }
}

static struct fctx *current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

static struct fstream *stream_of(CUstream s)
{
    struct fctx *c = current();
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return c ? &c->def : NULL;
    return (struct fstream *)s;
}

static uint64_t ctx_busy_until(struct fctx *c)
{
    uint64_t t = c->def.busy_until;
    for (int i = 0; i < c->n_streams; i++)
        if (c->streams[i] && c->streams[i]->busy_until > t)
            t = c->streams[i]->busy_until;
    return t;
}

/* Barrier kernels (their block below): every wait for a stream settles its barriers first. */
static void barrier_settle(struct fstream *st);
static void barrier_settle_ctx(struct fctx *c);
static int barrier_pending(struct fstream *st);
static int barrier_try(struct fstream *st);

#define NEED_INIT() do { if (!initialised) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (!current()) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

/* ---- init, devices ------------------------------------------------------------------------- */
EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (!initialised) {
        rc = setup_devices();
        initialised = rc == CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { NEED_INIT(); *n = n_devs; return CUDA_SUCCESS; }

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    NEED_INIT();
    if (ordinal < 0 || ordinal >= n_devs)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake GPU %d", dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    *u = devs[dev].uuid;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev) { return cuDeviceGetUuid(u, dev); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = devs[dev].total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    const char *no_vmm = getenv("FAKE_CUDA_NO_VMM");
    *v = attr == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9
       : attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? !(no_vmm && *no_vmm == '1')
       : attr == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED ? !(no_vmm && *no_vmm == '1')
       : 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs || peer < 0 || peer >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

/* ---- contexts ------------------------------------------------------------------------------ */
static struct fctx *new_ctx(int dev)
{
    if (devs[dev].path[0]) {     /* a context opens its device again; the real driver does too */
        int fd = open_device_file(devs[dev].path);
        if (fd < 0)
            return NULL;
        close(fd);
    }
    struct fctx *c = calloc(1, sizeof *c);
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->def.ctx = c;
    return c;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (!devs[dev].primary)
        devs[dev].primary = new_ctx(dev);
    *pctx = (CUcontext)devs[dev].primary;
    pthread_mutex_unlock(&mu);
    return *pctx ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { (void)dev; return CUDA_SUCCESS; }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { (void)dev; return CUDA_SUCCESS; }

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (ctx_depth == 0) {
        if (ctx) ctx_stack[ctx_depth++] = (struct fctx *)ctx;
    } else if (ctx) {
        ctx_stack[ctx_depth - 1] = (struct fctx *)ctx;
    } else {
        ctx_depth--;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) { NEED_INIT(); *ctx = (CUcontext)current(); return CUDA_SUCCESS; }

static void complain_dead_context(const struct fctx *c);

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    NEED_INIT();
    if (ctx && ((struct fctx *)ctx)->magic != CTX_MAGIC)
        complain_dead_context((struct fctx *)ctx);
    if (!ctx || ((struct fctx *)ctx)->magic != CTX_MAGIC || ctx_depth >= 16) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_stack[ctx_depth++] = (struct fctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    NEED_CTX();
    struct fctx *c = ctx_stack[--ctx_depth];
    if (ctx) *ctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev) { NEED_CTX(); *dev = current()->dev; return CUDA_SUCCESS; }

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    struct fctx *c = new_ctx(dev);
    if (!c)
        return CUDA_ERROR_OPERATING_SYSTEM;
    *pctx = (CUcontext)c;
    return cuCtxPushCurrent_v2((CUcontext)c);
}
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return cuCtxCreate_v2(pctx, flags, dev); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev)
{ (void)p; (void)n; return cuCtxCreate_v2(pctx, flags, dev); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev)
{ (void)p; return cuCtxCreate_v2(pctx, flags, dev); }

static int capture_broken_by_sync(struct fctx *c);
static void pools_trim_at_sync(int dev);

EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    if (capture_broken_by_sync(current()))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    barrier_settle_ctx(current());
    pools_trim_at_sync(current()->dev);
    pthread_mutex_lock(&mu);
    uint64_t t = ctx_busy_until(current());
    pthread_mutex_unlock(&mu);
    sleep_until(t);
    return CUDA_SUCCESS;
}

/* CUDA 13: the context to synchronise is a parameter (NULL: the current one). */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    NEED_INIT();
    struct fctx *c = (struct fctx *)ctx;
    if (!c)
        return cuCtxSynchronize();
    if (c->magic != CTX_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
    if (cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = cuCtxSynchronize();
    cuCtxPopCurrent_v2(NULL);
    return rc;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    struct fctx *c = (struct fctx *)ctx;
    if (!c || c->magic != CTX_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
    barrier_settle_ctx(c);
    sleep_until(ctx_busy_until(c));
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1], sizeof(ctx_stack[0]) * (size_t)(ctx_depth - i - 1));
            ctx_depth--;
            i--;
        }
    c->magic = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

/* ---- streams ------------------------------------------------------------------------------- */
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    struct fctx *c = current();
    if (c->n_streams >= 64) return CUDA_ERROR_OUT_OF_MEMORY;
    struct fstream *st = calloc(1, sizeof *st);
    st->ctx = c;
    pthread_mutex_lock(&mu);
    c->streams[c->n_streams++] = st;
    pthread_mutex_unlock(&mu);
    *s = (CUstream)st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) { (void)s; return CUDA_SUCCESS; }

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    NEED_CTX();
    struct fstream *st = stream_of(s);
    barrier_settle(st);
    pthread_mutex_lock(&mu);
    uint64_t t = st->busy_until;
    pthread_mutex_unlock(&mu);
    sleep_until(t);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }

EXPORT CUresult cuStreamQuery(CUstream s)
{
    NEED_CTX();
    if (!barrier_try(stream_of(s)))
        return CUDA_ERROR_NOT_READY;
    return now_ns() >= stream_of(s)->busy_until ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* Events: done once the stream's work queued before the record has run (its busy_until then). */
struct fevent { int magic; uint64_t at; };
#define EVENT_MAGIC 0x45564e54
EXPORT CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    struct fevent *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    *ev = (CUevent)e;
    return CUDA_SUCCESS;
}
static struct fevent *event_of(CUevent ev)
{
    struct fevent *e = (struct fevent *)ev;
    return e && e->magic == EVENT_MAGIC ? e : NULL;
}
static CUresult event_behind(struct fevent *e, struct fstream *st);
EXPORT CUresult cuEventRecord(CUevent ev, CUstream s)
{
    NEED_CTX();
    struct fevent *e = event_of(ev);
    struct fstream *st = stream_of(s);
    if (!e || !st) return CUDA_ERROR_INVALID_HANDLE;
    if (barrier_pending(st))
        return event_behind(e, st);   /* done once what is pending before it is settled */
    pthread_mutex_lock(&mu);
    uint64_t n = now_ns();
    e->at = st->busy_until > n ? st->busy_until : n;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent ev)
{
    struct fevent *e = event_of(ev);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    return now_ns() >= e->at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    struct fevent *x = event_of(a), *y = event_of(b);
    if (!x || !y) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t n = now_ns();
    if (n < x->at || n < y->at) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)y->at - (double)x->at) / 1e6);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent ev)
{
    struct fevent *e = event_of(ev);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx)
{
    NEED_CTX();
    *ctx = (CUcontext)stream_of(s)->ctx;
    return CUDA_SUCCESS;
}

/* ---- barrier kernels ------------------------------------------------------------------------ */
/* A barrier's end is not known at its launch, so a stream with a barrier in it keeps its work as
 * pending operations, settled (in order, traced then) by whoever waits for the stream. */
#define BAR_RANKS 16
#define BAR_RING 256
#define BAR_STREAMS 64
struct bar_shm {
    uint64_t launched[BAR_RANKS];                 /* barrier launches per rank */
    uint64_t arrival_ns[BAR_RANKS][BAR_RING];     /* when rank r launched its k-th: [r][k % RING] */
};
struct bar_op {
    int barrier;          /* 0: a sleep kernel queued behind a barrier (or a wait); BAR_* */
    uint64_t us, k, launch_ns;
    int ranks;
    volatile uint32_t *word;   /* BAR_WAIT: the host word it waits on ... (BAR_WRITE: writes) */
    uint32_t value;            /* ... until it equals this (or is at least this: geq); BAR_WRITE: this */
    int geq;
    struct fevent *ev;         /* BAR_EVENT: the event recorded behind a pending operation */
    struct bar_op *next;
};
#define BAR_KERNEL 0
#define BAR_BARRIER 1
#define BAR_WAIT 2
#define BAR_EVENT 3
#define BAR_WRITE 4
static struct {
    struct fstream *st;
    struct bar_op *head, *tail;
} bar_streams[BAR_STREAMS];
static struct bar_shm *bar_group;
static pthread_mutex_t bar_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ffunc barrier_func = {3};

static struct bar_shm *bar_map(void)
{
    if (bar_group)
        return bar_group;
    const char *name = getenv("FAKE_CUDA_BARRIER");
    if (!name || !*name)
        return NULL;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, sizeof(struct bar_shm)) == 0) {
        void *p = mmap(NULL, sizeof(struct bar_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED)
            bar_group = p;
    }
    close(fd);
    return bar_group;
}

/* With bar_mu held: the pending list of st (NULL: none), or a new empty one when create. */
static int bar_slot(struct fstream *st, int create)
{
    for (int i = 0; i < BAR_STREAMS; i++)
        if (bar_streams[i].st == st)
            return i;
    if (!create)
        return -1;
    for (int i = 0; i < BAR_STREAMS; i++)
        if (!bar_streams[i].st) {
            bar_streams[i].st = st;
            return i;
        }
    return -1;
}

static int barrier_pending(struct fstream *st)
{
    pthread_mutex_lock(&bar_mu);
    int i = bar_slot(st, 0);
    pthread_mutex_unlock(&bar_mu);
    return i >= 0;
}

static void bar_trace(int dev, uint64_t start, uint64_t end, uint64_t launched)
{
    if (trace_fd < 0)
        return;
    char line[160];
    int len = trace_launch
        ? snprintf(line, sizeof line, "%d %s %llu %llu %llu\n", (int)getpid(), devs[dev].text,
                   (unsigned long long)start, (unsigned long long)end, (unsigned long long)launched)
        : snprintf(line, sizeof line, "%d %s %llu %llu\n", (int)getpid(), devs[dev].text,
                   (unsigned long long)start, (unsigned long long)end);
    ssize_t w = write(trace_fd, line, (size_t)len);
    (void)w;
}

/* With bar_mu held: settle what can be settled in slot i; 1 when nothing is pending any more. */
static int bar_resolve(int i)
{
    struct fstream *st = bar_streams[i].st;
    while (bar_streams[i].head) {
        struct bar_op *op = bar_streams[i].head;
        pthread_mutex_lock(&mu);
        uint64_t start = st->busy_until > op->launch_ns ? st->busy_until : op->launch_ns;
        pthread_mutex_unlock(&mu);
        uint64_t ready = start;
        if (op->barrier == BAR_WAIT) {
            /* The GPU's front end looks at the word: the wait ends when the poller (or whoever
             * waits for the stream) sees it satisfied. */
            uint64_t seen = now_ns();
            if (start > seen)
                return 0;   /* the stream has not reached it yet: the word is read when it does */
            uint32_t v = __atomic_load_n(op->word, __ATOMIC_ACQUIRE);
            if (op->geq ? v < op->value : v != op->value)
                return 0;
            ready = seen > start ? seen : start;
        } else if (op->barrier == BAR_WRITE) {
            /* Written when the stream reaches it (the poller, or whoever waits for the stream). */
            if (start > now_ns())
                return 0;
            __atomic_store_n(op->word, op->value, __ATOMIC_RELEASE);
        } else if (op->barrier == BAR_EVENT) {
            op->ev->at = start;
        } else if (op->barrier == BAR_BARRIER) {
            uint64_t last = 0;
            for (int r = 0; r < op->ranks; r++) {
                if (__atomic_load_n(&bar_group->launched[r], __ATOMIC_ACQUIRE) <= op->k)
                    return 0;                      /* a rank has not launched its k-th yet */
                uint64_t t = bar_group->arrival_ns[r][op->k % BAR_RING];
                last = t > last ? t : last;
            }
            ready = last > start ? last : start;
        }
        uint64_t end = ready + op->us * 1000;
        pthread_mutex_lock(&mu);
        st->busy_until = end;
        pthread_mutex_unlock(&mu);
        if (op->barrier == BAR_KERNEL || op->barrier == BAR_BARRIER)
            bar_trace(st->ctx->dev, start, end, op->launch_ns);
        bar_streams[i].head = op->next;
        free(op);
    }
    bar_streams[i].st = NULL;
    bar_streams[i].tail = NULL;
    return 1;
}

static CUresult bar_enqueue(struct fstream *st, struct bar_op *op);

static CUresult barrier_launch(struct ffunc *fn, struct fstream *st, void **params)
{
    uint64_t us = params && params[0] ? *(unsigned long long *)params[0] : 0;
    struct bar_op *op = calloc(1, sizeof *op);
    op->us = us;
    op->launch_ns = now_ns();
    pthread_mutex_lock(&bar_mu);
    if (fn == &barrier_func) {
        int ranks = params && params[1] ? *(int *)params[1] : 0;
        int rank = params && params[2] ? *(int *)params[2] : -1;
        if (!bar_map() || ranks < 1 || ranks > BAR_RANKS || rank < 0 || rank >= ranks) {
            pthread_mutex_unlock(&bar_mu);
            free(op);
            return CUDA_ERROR_INVALID_VALUE;
        }
        op->barrier = 1;
        op->ranks = ranks;
        op->k = bar_group->launched[rank];
        bar_group->arrival_ns[rank][op->k % BAR_RING] = op->launch_ns;
        __atomic_store_n(&bar_group->launched[rank], op->k + 1, __ATOMIC_RELEASE);
    }
    return bar_enqueue(st, op);
}

/* With bar_mu held (released here): op joins st's pending operations. */
static CUresult bar_enqueue(struct fstream *st, struct bar_op *op)
{
    int i = bar_slot(st, 1);
    if (i < 0) {
        pthread_mutex_unlock(&bar_mu);
        free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (bar_streams[i].tail)
        bar_streams[i].tail->next = op;
    else
        bar_streams[i].head = op;
    bar_streams[i].tail = op;
    pthread_mutex_unlock(&bar_mu);
    return CUDA_SUCCESS;
}

/* ---- waits on a host word (cuStreamWaitValue32) ----------------------------------------------
 * A wait is a pending operation (as a barrier): what the stream gets after it waits too, and a
 * thread of this process looks at every pending wait each WAIT_POLL_US (a GPU's front end polls the
 * word), so held work starts about when the word is written, not when someone next waits for the
 * stream. FAKE_CUDA_NO_WAIT_VALUE=1 refuses them (CUDA_ERROR_NOT_SUPPORTED, as a driver without
 * stream memory operations does). Only host memory made with cuMemHostAlloc is waited on here. */
#define WAIT_POLL_US 20
static void *wait_poller(void *arg)
{
    (void)arg;
    struct timespec pause = {0, WAIT_POLL_US * 1000};
    for (;;) {
        pthread_mutex_lock(&bar_mu);
        for (int i = 0; i < BAR_STREAMS; i++)
            if (bar_streams[i].st)
                bar_resolve(i);
        pthread_mutex_unlock(&bar_mu);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static pthread_once_t poller_once = PTHREAD_ONCE_INIT;
static void start_poller(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, wait_poller, NULL) == 0)
        pthread_detach(t);
}

/* A wait on a host word (BAR_WAIT) or a write of one (BAR_WRITE) joins the stream's pending
 * operations. FAKE_CUDA_NO_WAIT_VALUE=1 refuses both (CUDA_ERROR_NOT_SUPPORTED). */
static CUresult word_op(CUstream s, CUdeviceptr addr, cuuint32_t value, int barrier, int geq)
{
    const char *no = getenv("FAKE_CUDA_NO_WAIT_VALUE");
    if (no && *no == '1')
        return CUDA_ERROR_NOT_SUPPORTED;
    struct fstream *st = stream_of(s);
    if (!st || !addr)
        return CUDA_ERROR_INVALID_VALUE;
    if (st->capturing)
        return CUDA_SUCCESS;   /* recorded, not run (no graph replays it here) */
    struct bar_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->barrier = barrier;
    op->word = (volatile uint32_t *)(uintptr_t)addr;
    op->value = value;
    op->geq = geq;
    op->launch_ns = now_ns();
    pthread_once(&poller_once, start_poller);
    pthread_mutex_lock(&bar_mu);
    return bar_enqueue(st, op);
}

EXPORT CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    NEED_CTX();
    if ((flags & 0xf) > 1)   /* GEQ (0) and EQ (1) only */
        return CUDA_ERROR_INVALID_VALUE;
    return word_op(s, addr, value, BAR_WAIT, (flags & 0xf) == 0);
}
EXPORT CUresult cuStreamWaitValue32(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{ return cuStreamWaitValue32_v2(s, addr, value, flags); }

/* A write of a host word in stream order (cuStreamWriteValue32): done when the stream reaches it,
 * as the GPU does once the work before it has run. */
EXPORT CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    NEED_CTX();
    if (flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    return word_op(s, addr, value, BAR_WRITE, 0);
}
EXPORT CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{ return cuStreamWriteValue32_v2(s, addr, value, flags); }

/* Mapped host memory: the device sees it at the same address (unified addressing).
 * FAKE_CUDA_NO_HOST_DEVICE_POINTER=1 refuses it (CUDA_ERROR_NOT_SUPPORTED) after a registration
 * succeeded, so that the hook's undoing of a half-made mapping is tested. */
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    const char *no = getenv("FAKE_CUDA_NO_HOST_DEVICE_POINTER");
    if (no && *no == '1')
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!d || !p) return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static CUresult event_behind(struct fevent *e, struct fstream *st)
{
    struct bar_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->barrier = BAR_EVENT;
    op->ev = e;
    op->launch_ns = now_ns();
    e->at = UINT64_MAX;
    pthread_mutex_lock(&bar_mu);
    return bar_enqueue(st, op);
}

/* Spins (like the kernel) until the stream's barriers and what follows them are settled. */
static void barrier_settle(struct fstream *st)
{
    struct timespec pause = {0, 50000};
    for (;;) {
        pthread_mutex_lock(&bar_mu);
        int i = bar_slot(st, 0);
        int done = i < 0 || bar_resolve(i);
        pthread_mutex_unlock(&bar_mu);
        if (done)
            return;
        nanosleep(&pause, NULL);
    }
}

static int barrier_try(struct fstream *st)
{
    pthread_mutex_lock(&bar_mu);
    int i = bar_slot(st, 0);
    int done = i < 0 || bar_resolve(i);
    pthread_mutex_unlock(&bar_mu);
    return done;
}

static void barrier_settle_ctx(struct fctx *c)
{
    barrier_settle(&c->def);
    for (int i = 0; i < c->n_streams; i++)
        if (c->streams[i])
            barrier_settle(c->streams[i]);
}

/* ---- modules and kernels ------------------------------------------------------------------- */
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    (void)image;
    NEED_CTX();
    *m = (CUmodule)calloc(1, sizeof(struct fmod));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule m) { free(m); return CUDA_SUCCESS; }

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    NEED_CTX();
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    if (strcmp(name, "sleep") == 0) *f = (CUfunction)&sleep_func;
    else if (strcmp(name, "empty") == 0) *f = (CUfunction)&empty_func;
    else if (strcmp(name, "barrier") == 0) *f = (CUfunction)&barrier_func;
    else return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

static CUresult run_sleep(struct fstream *st, uint64_t us, int traced);

static CUresult run_kernel(CUfunction f, CUstream s, void **params)
{
    NEED_CTX();
    struct ffunc *fn = (struct ffunc *)f;
    if (fn == &barrier_func || (fn == &sleep_func && barrier_pending(stream_of(s))))
        return barrier_launch(fn, stream_of(s), params);
    if (fn != &sleep_func && fn != &empty_func) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t us = fn == &sleep_func && params && params[0] ? *(unsigned long long *)params[0] : 0;
    struct fstream *st = stream_of(s);
    if (st && st->capturing) {
        st->captured_us += us;  /* recorded, not run */
        return CUDA_SUCCESS;
    }
    return run_sleep(st, us, fn == &sleep_func);
}

/* Runs a sleep of `us` on st (a kernel, or a replayed graph), traced as one kernel. */
static CUresult run_sleep(struct fstream *st, uint64_t us, int traced)
{
    if (us == 0 && trace_fd < 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    uint64_t n = now_ns();
    uint64_t start = st->busy_until > n ? st->busy_until : n;
    uint64_t end = start + us * 1000;
    st->busy_until = end;
    int dev = st->ctx->dev;
    pthread_mutex_unlock(&mu);
    if (trace_fd >= 0 && traced) {
        char line[160];
        /* pid, GPU, start, end; with FAKE_CUDA_TRACE_LAUNCH=1 also when it was launched (it waited
         * start - launched behind its stream's work) */
        int len = trace_launch
            ? snprintf(line, sizeof line, "%d %s %llu %llu %llu\n", (int)getpid(), devs[dev].text,
                       (unsigned long long)start, (unsigned long long)end, (unsigned long long)n)
            : snprintf(line, sizeof line, "%d %s %llu %llu\n", (int)getpid(), devs[dev].text,
                       (unsigned long long)start, (unsigned long long)end);
        ssize_t w = write(trace_fd, line, (size_t)len);
        (void)w;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)extra;
    return run_kernel(f, s, params);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{ return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra); }
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{ (void)extra; return run_kernel(f, cfg ? cfg->hStream : NULL, params); }
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{ return cuLaunchKernelEx(cfg, f, params, extra); }
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params)
{ (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; return run_kernel(f, s, params); }

/* ---- memory -------------------------------------------------------------------------------- */
static CUresult fake_alloc(CUdeviceptr *dptr, size_t size, int dev)
{
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (take_device_memory(dev, size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        give_device_memory(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct falloc *a = malloc(sizeof *a);
    pthread_mutex_lock(&mu);
    *a = (struct falloc){(uint64_t)(uintptr_t)p, size, dev, allocs};
    allocs = a;
    pthread_mutex_unlock(&mu);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { NEED_CTX(); return fake_alloc(dptr, size, current()->dev); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{ (void)flags; NEED_CTX(); return fake_alloc(dptr, size, current()->dev); }
static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool);
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{ (void)s; NEED_CTX(); return pool_alloc(dptr, size, NULL); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) { return cuMemAllocAsync(dptr, size, s); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    (void)elem;
    NEED_CTX();
    *pitch = (w + 511) / 512 * 512;
    return fake_alloc(dptr, *pitch * h, current()->dev);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    for (struct falloc **pp = &allocs; *pp; pp = &(*pp)->next) {
        struct falloc *a = *pp;
        if (a->ptr == dptr) {
            *pp = a->next;
            give_device_memory(a->dev, a->size);
            munmap((void *)(uintptr_t)a->ptr, a->size);
            free(a);
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
}
static int pool_free(CUdeviceptr dptr);
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { (void)s; return pool_free(dptr) ? CUDA_SUCCESS : cuMemFree_v2(dptr); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return cuMemFreeAsync(dptr, s); }

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    NEED_CTX();
    struct fdev *d = &devs[current()->dev];
    if (shared_memory)
        fake_reap(shared_memory);
    uint64_t used = __atomic_load_n(d->used, __ATOMIC_SEQ_CST);
    *free_bytes = used < d->total ? d->total - used : 0;
    *total = d->total;
    return CUDA_SUCCESS;
}

static void wait_ctx(void)
{
    struct fctx *c = current();
    barrier_settle_ctx(c);
    pthread_mutex_lock(&mu);
    uint64_t t = ctx_busy_until(c);
    pthread_mutex_unlock(&mu);
    sleep_until(t);
}

/* FAKE_CUDA_SWAP_COPY_MS=N: a copy between host and device of 64 MiB or more (the hook's swap chunks;
 * test programs copy in smaller pieces) takes N ms; FAKE_CUDA_COPY_LOG names a file that then gets
 * "pid dtoh|htod bytes start_ns end_ns" (CLOCK_MONOTONIC) for each such copy. */
static void slow_copy(void *dst, const void *src, size_t n, const char *way)
{
    const char *ms = getenv("FAKE_CUDA_SWAP_COPY_MS");
    uint64_t start = now_ns();
    memcpy(dst, src, n);
    if (!ms || n < (64u << 20))
        return;
    sleep_until(start + strtoull(ms, NULL, 10) * 1000000ull);
    const char *log = getenv("FAKE_CUDA_COPY_LOG");
    int fd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    if (fd >= 0) {
        dprintf(fd, "%d %s %zu %llu %llu\n", (int)getpid(), way, n, (unsigned long long)start,
                (unsigned long long)now_ns());
        close(fd);
    }
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{ NEED_CTX(); wait_ctx(); slow_copy((void *)(uintptr_t)dst, src, n, "htod"); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) { return cuMemcpyHtoD_v2(dst, src, n); }
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{ NEED_CTX(); wait_ctx(); slow_copy(dst, (const void *)(uintptr_t)src, n, "dtoh"); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoH_v2(dst, src, n); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{ NEED_CTX(); wait_ctx(); memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{ (void)s; return cuMemcpyHtoD_v2(dst, src, n); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{ (void)s; return cuMemcpyDtoH_v2(dst, src, n); }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{ NEED_CTX(); wait_ctx(); memset((void *)(uintptr_t)dst, v, n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n) { return cuMemsetD8_v2(dst, v, n); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { (void)s; return cuMemsetD8_v2(dst, v, n); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
    NEED_CTX(); wait_ctx();
    for (size_t i = 0; i < n; i++) ((unsigned int *)(uintptr_t)dst)[i] = v;
    return CUDA_SUCCESS;
}

/* Pinned host memory: committed and touched, as pinning makes it resident. */
EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    (void)flags;
    NEED_INIT();
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0, size);
    *pp = p;
    pthread_mutex_lock(&mu);
    struct falloc *a = malloc(sizeof *a);
    *a = (struct falloc){(uint64_t)(uintptr_t)p, size, -1, host_allocs};
    host_allocs = a;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* Takes the host record of `p` out of `list` (and unmaps it with `unmap`); `missing` if none. */
static CUresult drop_host(struct falloc **list, void *p, int unmap, CUresult missing)
{
    pthread_mutex_lock(&mu);
    struct falloc *found = NULL;
    for (struct falloc **pp = list; *pp; pp = &(*pp)->next)
        if ((*pp)->ptr == (uint64_t)(uintptr_t)p) {
            found = *pp;
            *pp = found->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    if (!found)
        return missing;
    if (unmap)
        munmap(p, found->size);
    free(found);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    NEED_INIT();
    return drop_host(&host_allocs, p, 1, CUDA_ERROR_INVALID_VALUE);
}

static struct falloc *host_registered;

/* Registered host memory (cuMemHostRegister): the pages are touched, as pinning makes them resident,
 * and kept as they are. FAKE_CUDA_NO_HOST_REGISTER=1 refuses it (CUDA_ERROR_NOT_SUPPORTED, as some
 * drivers and containers do), so that the hook's fallback to cuMemHostAlloc is tested. */

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    (void)flags;
    NEED_INIT();
    const char *no = getenv("FAKE_CUDA_NO_HOST_REGISTER");
    if (no && *no == '1')
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < size; i += 4096)
        ((volatile char *)p)[i] = ((volatile char *)p)[i];
    pthread_mutex_lock(&mu);
    for (struct falloc *a = host_registered; a; a = a->next)
        if (a->ptr < (uint64_t)(uintptr_t)p + size && (uint64_t)(uintptr_t)p < a->ptr + a->size) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    struct falloc *a = malloc(sizeof *a);
    *a = (struct falloc){(uint64_t)(uintptr_t)p, size, -1, host_registered};
    host_registered = a;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    NEED_INIT();
    return drop_host(&host_registered, p, 0, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* FAKE_CUDA_REPORT_HOST_REGISTERED=1: at exit, stderr gets "fake_cuda: N host range(s) registered at
 * exit", so a test can see a registration nobody undid. */
__attribute__((destructor)) static void report_host_registered(void)
{
    const char *on = getenv("FAKE_CUDA_REPORT_HOST_REGISTERED");
    if (!on || *on != '1')
        return;
    size_t n = 0;
    pthread_mutex_lock(&mu);
    for (struct falloc *a = host_registered; a; a = a->next)
        n++;
    pthread_mutex_unlock(&mu);
    fprintf(stderr, "fake_cuda: %zu host range(s) registered at exit\n", n);
}

/* ---- virtual memory ------------------------------------------------------------------------ */
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{ (void)prop; (void)option; NEED_INIT(); *g = 2u << 20; return CUDA_SUCCESS; }

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags)
{
    (void)align; (void)addr; (void)flags;
    NEED_INIT();
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{ NEED_INIT(); munmap((void *)(uintptr_t)ptr, size); return CUDA_SUCCESS; }

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    (void)flags;
    NEED_INIT();
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= n_devs || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    /* FAKE_CUDA_NO_FD_CREATE=1: a driver that reports fd handles but refuses them at creation. */
    const char *no_fd = getenv("FAKE_CUDA_NO_FD_CREATE");
    if (no_fd && *no_fd == '1' && (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (take_device_memory(dev, size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* FAKE_CUDA_CREATE_MS: the process's first creation of more than the 2 MiB granularity (the
     * hook probes with one of 2 MiB) takes that long once the memory is taken (a real GPU's large
     * allocation takes tens of milliseconds), so a test can act meanwhile. */
    static int created_large;
    const char *create_ms = getenv("FAKE_CUDA_CREATE_MS");
    if (size > (2u << 20) && !__atomic_fetch_add(&created_large, 1, __ATOMIC_SEQ_CST) && create_ms &&
        atoi(create_ms) > 0)
        usleep((useconds_t)atoi(create_ms) * 1000);
    struct fhandle *h = malloc(sizeof *h);
    h->fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    h->size = size;
    h->dev = dev;
    h->exportable = (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
    h->imported = 0;
    if (h->fd < 0 || ftruncate(h->fd, (off_t)size) != 0) {
        give_device_memory(dev, size);
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NEED_INIT();
    struct fhandle *h = (struct fhandle *)(uintptr_t)handle;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (!h->imported)
        give_device_memory(h->dev, h->size);
    close(h->fd);
    free(h);
    return CUDA_SUCCESS;
}

static void note_mapping(CUdeviceptr ptr, size_t size, int mapped);

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags)
{
    (void)flags;
    NEED_INIT();
    struct fhandle *h = (struct fhandle *)(uintptr_t)handle;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
    if (p == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    note_mapping(ptr, size, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    NEED_INIT();
    int prot = count && desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
             : count && desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ : PROT_NONE;
    return mprotect((void *)(uintptr_t)ptr, size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* FAKE_CUDA_UNMAP_FAIL=N: the next N unmaps fail (per process), as a driver in trouble would. */
static int unmap_should_fail(void)
{
    static int left = -1;
    pthread_mutex_lock(&mu);
    if (left < 0) {
        const char *n = getenv("FAKE_CUDA_UNMAP_FAIL");
        left = n ? atoi(n) : 0;
    }
    int fail = left > 0;
    if (fail)
        left--;
    pthread_mutex_unlock(&mu);
    return fail;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    if (unmap_should_fail())
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    note_mapping(ptr, size, 0);
    return CUDA_SUCCESS;
}

/* ---- errors -------------------------------------------------------------------------------- */
EXPORT CUresult cuGetErrorString(CUresult e, const char **s)
{
    *s = e == CUDA_SUCCESS ? "no error" : e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake cuda error";
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s)
{
    *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---------------------------------------------------------------------- */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

#define FAKE_FUNCS(F) F(cuInit) F(cuDriverGetVersion) F(cuDeviceGetCount) F(cuDeviceGet) F(cuDeviceGetName) \
    F(cuDeviceGetUuid) F(cuDeviceGetUuid_v2) F(cuDeviceTotalMem_v2) F(cuDeviceGetAttribute)                 \
    F(cuDeviceCanAccessPeer) F(cuMemHostAlloc) F(cuMemFreeHost) F(cuMemHostRegister_v2) F(cuMemHostUnregister) \
    F(cuDevicePrimaryCtxRetain) F(cuDevicePrimaryCtxRelease) F(cuDevicePrimaryCtxRelease_v2)               \
    F(cuCtxSetCurrent) F(cuCtxGetCurrent) F(cuCtxPushCurrent_v2) F(cuCtxPopCurrent_v2) F(cuCtxGetDevice)   \
    F(cuCtxCreate) F(cuCtxCreate_v2) F(cuCtxCreate_v3) F(cuCtxCreate_v4) F(cuCtxSynchronize)               \
    F(cuCtxDestroy) F(cuCtxDestroy_v2) F(cuStreamCreate) F(cuStreamDestroy_v2) F(cuStreamSynchronize)      \
    F(cuStreamSynchronize_ptsz) F(cuStreamQuery) F(cuStreamGetCtx) F(cuModuleLoadData) F(cuModuleUnload)   \
    F(cuModuleGetFunction) F(cuLaunchKernel) F(cuLaunchKernel_ptsz) F(cuLaunchKernelEx)                    \
    F(cuLaunchKernelEx_ptsz) F(cuLaunchCooperativeKernel) F(cuMemAlloc_v2) F(cuMemAllocManaged)            \
    F(cuMemAllocAsync) F(cuMemAllocAsync_ptsz) F(cuMemAllocPitch_v2) F(cuMemFree_v2) F(cuMemFreeAsync)     \
    F(cuMemFreeAsync_ptsz) F(cuMemGetInfo_v2) F(cuMemcpyHtoD_v2) F(cuMemcpyHtoD_v2_ptds)                   \
    F(cuMemcpyDtoH_v2) F(cuMemcpyDtoH_v2_ptds) F(cuMemcpyDtoD_v2) F(cuMemcpyHtoDAsync_v2)                  \
    F(cuMemcpyDtoHAsync_v2) F(cuMemsetD8_v2) F(cuMemsetD8_v2_ptds) F(cuMemsetD8Async) F(cuMemsetD32_v2)    \
    F(cuMemGetAllocationGranularity) F(cuMemAddressReserve) F(cuMemAddressFree) F(cuMemCreate)             \
    F(cuMemRelease) F(cuMemMap) F(cuMemSetAccess) F(cuMemUnmap) F(cuGetErrorString) F(cuGetErrorName)      \
    F(cuGetProcAddress) F(cuGetProcAddress_v2) F(cuEventCreate) F(cuEventRecord) F(cuEventQuery)            \
    F(cuEventElapsedTime) F(cuEventDestroy_v2)

static const struct { const char *name; void *fn; } proc_table[] = {
#define PROC_ENTRY(n) {#n, (void *)n},
    FAKE_FUNCS(PROC_ENTRY)
};

static void *proc_find_more(const char *name);

static void *proc_find(const char *name)
{
    for (size_t i = 0; i < sizeof proc_table / sizeof proc_table[0]; i++)
        if (strcmp(proc_table[i].name, name) == 0)
            return proc_table[i].fn;
    return proc_find_more(name);
}

/* Like the driver: the newest ABI version the caller's cudaVersion knows, per-thread variants when
 * asked for (flag) or when the caller was built with per-thread default streams. */
static void *proc_resolve(const char *symbol, int version, cuuint64_t flags)
{
    static const struct { const char *suffix; int since; } versions[] = {
        {"_v4", 12050}, {"_v3", 11040}, {"_v2", 3020}, {"", 0}};
    char name[256];
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
        if (version < versions[v].since)
            continue;
        if (strcmp(symbol, "cuGetProcAddress") == 0 && versions[v].since && version < 12000)
            continue;
        if (strcmp(symbol, "cuCtxSynchronize") == 0 && versions[v].since && version < 13000)
            continue;
        if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
            static const char *pt[] = {"_ptsz", "_ptds"};
            for (int i = 0; i < 2; i++) {
                snprintf(name, sizeof name, "%s%s%s", symbol, versions[v].suffix, pt[i]);
                void *fn = proc_find(name);
                if (fn) return fn;
            }
        }
        snprintf(name, sizeof name, "%s%s", symbol, versions[v].suffix);
        void *fn = proc_find(name);
        if (fn) return fn;
    }
    return NULL;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = proc_resolve(symbol, cudaVersion, flags);
    if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- graphs, pools, batches (issue 10) -----------------------------------------------------
 * Stream capture: kernels launched on a capturing stream are recorded; cuCtxSynchronize while any
 * stream of the context captures answers 900 and invalidates the capture (as the H100 did), and
 * cuStreamEndCapture then answers 901. A graph replays the recorded sleep as one traced kernel.
 * Stream-ordered pools: one default pool per device plus created ones; a pool reserves device memory
 * as it grows and keeps it after cuMemFreeAsync down to its release threshold, trimmed at
 * synchronisation or by cuMemPoolTrimTo. FAKE_CUDA_GRAPH_MEM_RESERVED: graph memory reserved (bytes).
 * Batch copies (CUDA 13 _v2): synchronous memcpy of each pair, after the context's work. */
struct fgraph { uint64_t us; };
struct fpool { int dev; uint64_t reserved, used, threshold; };
struct fpalloc { uint64_t ptr, size; struct fpool *pool; struct fpalloc *next; };
static struct fpool default_pools[MAX_DEV];
static struct fpalloc *pool_allocs;

static int capture_broken_by_sync(struct fctx *c)
{
    int broken = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < c->n_streams; i++)
        if (c->streams[i] && c->streams[i]->capturing) {
            c->streams[i]->invalidated = 1;
            broken = 1;
        }
    pthread_mutex_unlock(&mu);
    return broken;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    (void)mode;
    NEED_CTX();
    struct fstream *st = stream_of(s);
    if (!s || st == &current()->def) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    st->capturing = 1;
    st->invalidated = 0;
    st->captured_us = 0;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) { return cuStreamBeginCapture_v2(s, mode); }

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
    NEED_CTX();
    struct fstream *st = stream_of(s);
    *status = !st->capturing ? CU_STREAM_CAPTURE_STATUS_NONE
            : st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    NEED_CTX();
    struct fstream *st = stream_of(s);
    if (!st->capturing) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    st->capturing = 0;
    int invalidated = st->invalidated;
    uint64_t us = st->captured_us;
    pthread_mutex_unlock(&mu);
    if (invalidated) {
        *graph = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    struct fgraph *gr = calloc(1, sizeof *gr);
    gr->us = us;
    *graph = (CUgraph)gr;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *graph) { return cuStreamEndCapture(s, graph); }

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    (void)flags;
    NEED_CTX();
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    *exec = (CUgraphExec)graph;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    NEED_CTX();
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    if (barrier_pending(stream_of(s)))   /* behind a wait: queued as a kernel of its length */
        return barrier_launch(&sleep_func, stream_of(s), (void *[]){&(unsigned long long){((struct fgraph *)exec)->us}});
    return run_sleep(stream_of(s), ((struct fgraph *)exec)->us, 1);
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) { return cuGraphLaunch(exec, s); }
EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream s) { (void)exec; (void)s; NEED_CTX(); return CUDA_SUCCESS; }

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    const char *reserved = getenv("FAKE_CUDA_GRAPH_MEM_RESERVED");
    *(cuuint64_t *)value = attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT && reserved ? strtoull(reserved, NULL, 10) : 0;
    return CUDA_SUCCESS;
}

/* -- pools -- */
static struct fpool *default_pool(int dev)
{
    default_pools[dev].dev = dev;
    return &default_pools[dev];
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    *pool = (CUmemoryPool)default_pool(dev);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) { return cuDeviceGetDefaultMemPool(pool, dev); }

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    NEED_INIT();
    if (!props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
        props->location.id >= n_devs)
        return CUDA_ERROR_INVALID_VALUE;
    struct fpool *p = calloc(1, sizeof *p);
    p->dev = props->location.id;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* With mu held: gives back what the pool holds beyond max(used, keep). */
static void pool_trim(struct fpool *p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    if (p->reserved > floor) {
        give_device_memory(p->dev, p->reserved - floor);
        p->reserved = floor;
    }
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    NEED_INIT();
    struct fpool *p = (struct fpool *)pool;
    pthread_mutex_lock(&mu);
    pool_trim(p, 0);
    pthread_mutex_unlock(&mu);
    if (p < default_pools || p >= default_pools + MAX_DEV)
        free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    pool_trim((struct fpool *)pool, keep);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    NEED_INIT();
    if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return CUDA_ERROR_INVALID_VALUE;
    ((struct fpool *)pool)->threshold = *(cuuint64_t *)value;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
    NEED_INIT();
    struct fpool *p = (struct fpool *)pool;
    cuuint64_t v;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = p->reserved; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = p->used; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}

static void pools_trim_at_sync(int dev)
{
    pthread_mutex_lock(&mu);
    pool_trim(default_pool(dev), default_pools[dev].threshold);
    pthread_mutex_unlock(&mu);
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool)
{
    struct fpool *p = pool ? (struct fpool *)pool : default_pool(current()->dev);
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (p->used + size > p->reserved) {
        uint64_t more = p->used + size - p->reserved;
        if (take_device_memory(p->dev, more) != 0) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved += more;
    }
    p->used += size;
    pthread_mutex_unlock(&mu);
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    struct fpalloc *a = malloc(sizeof *a);
    pthread_mutex_lock(&mu);
    *a = (struct fpalloc){(uint64_t)(uintptr_t)mem, size, p, pool_allocs};
    pool_allocs = a;
    pthread_mutex_unlock(&mu);
    *dptr = (CUdeviceptr)(uintptr_t)mem;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{ (void)s; NEED_CTX(); return pool_alloc(dptr, size, pool); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{ return cuMemAllocFromPoolAsync(dptr, size, pool, s); }

/* 1 when dptr came from a pool (now back in it). */
static int pool_free(CUdeviceptr dptr)
{
    pthread_mutex_lock(&mu);
    for (struct fpalloc **pp = &pool_allocs; *pp; pp = &(*pp)->next)
        if ((*pp)->ptr == dptr) {
            struct fpalloc *a = *pp;
            *pp = a->next;
            a->pool->used -= a->size;
            pthread_mutex_unlock(&mu);
            munmap((void *)(uintptr_t)a->ptr, a->size);
            free(a);
            return 1;
        }
    pthread_mutex_unlock(&mu);
    return 0;
}

/* -- CUDA 13 batch copies -- */
EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                      CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t n_attrs, CUstream s)
{
    (void)attrs; (void)attr_idxs; (void)n_attrs; (void)s;
    NEED_CTX();
    wait_ctx();
    for (size_t i = 0; i < count; i++)
        memmove((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i]);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                           CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t n_attrs, CUstream s)
{ return cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs, attr_idxs, n_attrs, s); }
EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count, CUmemLocation *locs,
                                        size_t *loc_idxs, size_t n_locs, unsigned long long flags, CUstream s)
{ (void)dptrs; (void)sizes; (void)count; (void)locs; (void)loc_idxs; (void)n_locs; (void)flags; (void)s; NEED_CTX(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count, unsigned long long flags, CUstream s)
{ (void)dptrs; (void)sizes; (void)count; (void)flags; (void)s; NEED_CTX(); return CUDA_SUCCESS; }

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    return peer && ((struct fctx *)peer)->magic == CTX_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* A real driver may crash on a destroyed context; the fake says so where tests can see it. */
static void complain_dead_context(const struct fctx *c)
{
    char line[96];
    int n = snprintf(line, sizeof line, "fake-cuda: a destroyed context (%p) was pushed\n", (const void *)c);
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    struct fctx *c = devs[dev].primary;
    devs[dev].primary = NULL;
    pthread_mutex_unlock(&mu);
    if (c)
        c->magic = 0;  /* pushing it now fails like a destroyed context */
    return CUDA_SUCCESS;
}

/* -- address ranges: like the driver, a VMM pointer's range is its mapping, not the reservation -- */
struct fmapping { uint64_t va, size; struct fmapping *next; };
static struct fmapping *mappings;

static void note_mapping(CUdeviceptr ptr, size_t size, int mapped)
{
    pthread_mutex_lock(&mu);
    if (mapped) {
        struct fmapping *m = malloc(sizeof *m);
        *m = (struct fmapping){ptr, size, mappings};
        mappings = m;
    } else {
        for (struct fmapping **pp = &mappings; *pp; pp = &(*pp)->next)
            if ((*pp)->va == ptr) {
                struct fmapping *m = *pp;
                *pp = m->next;
                free(m);
                break;
            }
    }
    pthread_mutex_unlock(&mu);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    NEED_CTX();
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&mu);
    for (struct falloc *a = allocs; a && rc; a = a->next)
        if (ptr >= a->ptr && ptr - a->ptr < a->size) {
            if (base) *base = a->ptr;
            if (size) *size = a->size;
            rc = CUDA_SUCCESS;
        }
    for (struct fmapping *m = mappings; m && rc; m = m->next)
        if (ptr >= m->va && ptr - m->va < m->size) {
            if (base) *base = m->va;
            if (size) *size = m->size;
            rc = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr)
{
    CUdeviceptr base;
    size_t size;
    CUresult rc = cuMemGetAddressRange_v2(&base, &size, ptr);
    if (rc != CUDA_SUCCESS) return rc;
    if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *(CUdeviceptr *)data = base;
    else if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *(size_t *)data = size;
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* -- green contexts: a context of their own (the resource split is not modelled) -- */
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *green, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
    (void)desc; (void)flags;
    NEED_INIT();
    if (dev < 0 || dev >= n_devs) return CUDA_ERROR_INVALID_DEVICE;
    *green = (CUgreenCtx)new_ctx(dev);
    return *green ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}
EXPORT CUresult cuCtxFromGreenCtx(CUcontext *ctx, CUgreenCtx green) { NEED_INIT(); *ctx = (CUcontext)green; return CUDA_SUCCESS; }
EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx green) { return cuCtxDestroy_v2((CUcontext)green); }
EXPORT CUresult cuGreenCtxStreamCreate(CUstream *s, CUgreenCtx green, unsigned int flags, int priority)
{
    (void)priority;
    NEED_INIT();
    if (cuCtxPushCurrent_v2((CUcontext)green) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = cuStreamCreate(s, flags);
    cuCtxPopCurrent_v2(NULL);
    return rc;
}

/* -- CUDA arrays: take element bytes x channels of device memory per level -- */
struct farray { int dev; uint64_t size; };

static uint64_t fake_element_bytes(int format)
{
    return format == CU_AD_FORMAT_UNSIGNED_INT8 || format == CU_AD_FORMAT_SIGNED_INT8 ? 1
         : format == CU_AD_FORMAT_UNSIGNED_INT16 || format == CU_AD_FORMAT_SIGNED_INT16 || format == CU_AD_FORMAT_HALF ? 2 : 4;
}

static CUresult fake_array(void **out, size_t w, size_t h, size_t d, int format, unsigned int channels)
{
    NEED_CTX();
    struct farray *a = malloc(sizeof *a);
    a->dev = current()->dev;
    a->size = (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1) * fake_element_bytes(format) * channels;
    if (take_device_memory(a->dev, a->size) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *d)
{ return fake_array((void **)array, d->Width, d->Height, 0, d->Format, d->NumChannels); }
EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *d)
{ return fake_array((void **)array, d->Width, d->Height, d->Depth, d->Format, d->NumChannels); }
EXPORT CUresult cuArrayDestroy(CUarray array)
{
    NEED_INIT();
    struct farray *a = (struct farray *)array;
    give_device_memory(a->dev, a->size);
    free(a);
    return CUDA_SUCCESS;
}

/* ---- sharing physical memory between processes --------------------------------------------- */
/* As the real driver: only memory made with the POSIX fd handle type exports, as a new fd. */
EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                             unsigned long long flags)
{
    (void)flags;
    NEED_INIT();
    struct fhandle *h = (struct fhandle *)(uintptr_t)handle;
    if (!h || !shareable || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !h->exportable)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(h->fd, F_DUPFD, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type)
{
    NEED_INIT();
    int fd = (int)(intptr_t)os_handle;
    struct stat st;
    if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) != 0 || st.st_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fhandle *h = malloc(sizeof *h);
    h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    h->size = (uint64_t)st.st_size;
    h->dev = 0;
    h->exportable = 1;
    h->imported = 1;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

/* Legacy IPC: this driver has none (the real one refuses virtual-memory allocations, and knows no
 * handle that it did not make): every call is refused as the real driver refuses those. */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr)
{ NEED_INIT(); (void)handle; (void)ptr; return CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{ NEED_INIT(); (void)dptr; (void)handle; (void)flags; return CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{ NEED_INIT(); (void)dptr; return CUDA_ERROR_INVALID_VALUE; }

/* ---- peer copies --------------------------------------------------------------------------- */
/* A copy between two GPUs waits for both contexts' work, takes FAKE_PEER_COPY_US (default 20 ms),
 * and is traced on both GPUs like a kernel: a test sees when it touched each one. */
static void wait_for(struct fctx *c)
{
    barrier_settle_ctx(c);
    pthread_mutex_lock(&mu);
    uint64_t t = ctx_busy_until(c);
    pthread_mutex_unlock(&mu);
    sleep_until(t);
}

EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n)
{
    NEED_INIT();
    struct fctx *d = (struct fctx *)dst_ctx, *s = (struct fctx *)src_ctx;
    if (!d || !s || d->magic != CTX_MAGIC || s->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    wait_for(s);
    wait_for(d);
    const char *us_text = getenv("FAKE_PEER_COPY_US");
    uint64_t us = us_text ? strtoull(us_text, NULL, 10) : 20000;
    uint64_t start = now_ns();
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    sleep_until(start + us * 1000);
    uint64_t end = now_ns();
    bar_trace(s->dev, start, end, start);
    if (d->dev != s->dev)
        bar_trace(d->dev, start, end, start);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                  size_t n, CUstream st)
{ (void)st; return cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n); }

/* The 3D form, for the one-row copies the tests make: WidthInBytes x Height x Depth bytes in a row.
 * An array side's context is ignored, as the driver documents; such a copy is traced on the other
 * side's GPU only, its bytes not moved. */
EXPORT CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *p)
{
    NEED_INIT();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->srcMemoryType == 3 || p->dstMemoryType == 3) {
        struct fctx *c = (struct fctx *)(p->srcMemoryType == 3 ? p->dstContext : p->srcContext);
        if (p->srcMemoryType == 3 && p->dstMemoryType == 3)
            return CUDA_ERROR_NOT_SUPPORTED;
        if (!c || c->magic != CTX_MAGIC)
            return CUDA_ERROR_INVALID_CONTEXT;
        wait_for(c);
        uint64_t now = now_ns();
        bar_trace(c->dev, now, now, now);
        return CUDA_SUCCESS;
    }
    return cuMemcpyPeer(p->dstDevice + p->dstXInBytes, p->dstContext, p->srcDevice + p->srcXInBytes, p->srcContext,
                        p->WidthInBytes * (p->Height ? p->Height : 1) * (p->Depth ? p->Depth : 1));
}
EXPORT CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *p, CUstream st)
{ (void)st; return cuMemcpy3DPeer(p); }

#define FAKE_FUNCS_MORE(F) F(cuArrayCreate_v2) F(cuArray3DCreate_v2) F(cuArrayDestroy)                          \
    F(cuMemGetAddressRange_v2) F(cuPointerGetAttribute) F(cuGreenCtxCreate)                                    \
    F(cuCtxFromGreenCtx) F(cuGreenCtxDestroy) F(cuGreenCtxStreamCreate) F(cuStreamBeginCapture_v2) F(cuStreamBeginCapture_v2_ptsz) F(cuStreamIsCapturing)      \
    F(cuStreamEndCapture) F(cuStreamEndCapture_ptsz) F(cuGraphInstantiateWithFlags) F(cuGraphLaunch)           \
    F(cuGraphLaunch_ptsz) F(cuGraphUpload) F(cuDeviceGetGraphMemAttribute) F(cuDeviceGetDefaultMemPool)       \
    F(cuDeviceGetMemPool) F(cuMemPoolCreate) F(cuMemPoolDestroy) F(cuMemPoolTrimTo) F(cuMemPoolSetAttribute)   \
    F(cuMemPoolGetAttribute) F(cuMemAllocFromPoolAsync) F(cuMemAllocFromPoolAsync_ptsz)                        \
    F(cuCtxSynchronize_v2) F(cuMemcpyBatchAsync_v2) F(cuMemcpyBatchAsync_v2_ptsz) F(cuMemPrefetchBatchAsync) F(cuMemDiscardBatchAsync) \
    F(cuCtxEnablePeerAccess) F(cuDevicePrimaryCtxReset_v2) F(cuMemExportToShareableHandle)                    \
    F(cuMemImportFromShareableHandle) F(cuIpcGetMemHandle) F(cuIpcOpenMemHandle_v2) F(cuIpcCloseMemHandle)  \
    F(cuMemcpyPeer) F(cuMemcpyPeerAsync) F(cuMemcpy3DPeer) F(cuMemcpy3DPeerAsync)                   \
    F(cuStreamWaitValue32) F(cuStreamWaitValue32_v2) F(cuMemHostGetDevicePointer_v2)                    \
    F(cuStreamWriteValue32) F(cuStreamWriteValue32_v2)

static const struct { const char *name; void *fn; } proc_table_more[] = {
    FAKE_FUNCS_MORE(PROC_ENTRY)
};

static void *proc_find_more(const char *name)
{
    for (size_t i = 0; i < sizeof proc_table_more / sizeof proc_table_more[0]; i++)
        if (strcmp(proc_table_more[i].name, name) == 0)
            return proc_table_more[i].fn;
    return NULL;
}
