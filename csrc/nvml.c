/* nvml.c: NVML as a managed job sees it.
 *
 * nvidia-smi, nvitop, pynvml and the checks of frameworks read the GPU through NVML, not CUDA. Inside a
 * managed job (NVSHARE_JOB_ID and NVSHARE_SOCKET set) NVML here says what CUDA says:
 *  - the GPUs the job was given, in CUDA_VISIBLE_DEVICES order, when the TaskProlog named them by UUID:
 *    the count and index calls count and number only those;
 *  - on a managed GPU (NVSHARE_MANAGED_GPUS), the memory: total is NVSHARE_MEM_LIMIT where that is
 *    smaller, used is what the job's own processes hold, free is the device's free memory, at most
 *    total minus used;
 *  - on a managed GPU, the running-process lists hold the job's own processes only, and another
 *    job's process has no name (nvmlSystemGetProcessName);
 *  - everything else (utilisation, clocks, temperatures) is the device's, unchanged.
 * A process belongs to the job when /proc/<pid>/cgroup places it in this process's Slurm job cgroup
 * (job_<id>), or, where jobs have no cgroup (proctrack/linuxproc), when its environment, which only its
 * own user may read, names this job. A pid this process cannot see (another PID namespace) is not shown.
 *
 * Outside a managed job every call goes straight to NVML. NVML's own error codes pass through unchanged.
 * The functions reach the program two ways: dlsym (hook.c asks nvshare_nvml_wrapper; pynvml, nvidia-smi)
 * and, for a program linked to libnvidia-ml.so.1, the exported names, which the preload puts first.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "env.h"
#include "nvml.h"

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_UNKNOWN 999

/* nvml.h's layouts (stable ABI: each version is its own struct). */
struct nvml_memory_v1 { unsigned long long total, free, used; };
struct nvml_memory_v2 { unsigned int version; unsigned long long total, reserved, free, used; };
struct nvml_proc_v1 { unsigned int pid; unsigned long long used; };
struct nvml_proc_v2 { unsigned int pid; unsigned long long used; unsigned int gi, ci; };
struct nvml_proc_detail_v1 {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci;
    unsigned long long cc_protected;
};
struct nvml_proc_detail_list_v1 {
    unsigned int version, mode, count;
    struct nvml_proc_detail_v1 *procs;
};

#define UUID_BUF 96   /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */

/* ---- the real functions ---------------------------------------------------------------------- */
enum real_id {
    R_COUNT, R_COUNT_V2, R_BY_INDEX, R_BY_INDEX_V2, R_INDEX, R_MEM, R_MEM_V2,
    R_COMPUTE, R_COMPUTE_V2, R_COMPUTE_V3, R_GRAPHICS, R_GRAPHICS_V2, R_GRAPHICS_V3,
    R_MPS, R_MPS_V2, R_MPS_V3, R_DETAIL, R_PROC_NAME,
    R_BY_UUID, R_UUID,  /* called, not interposed */
    R_N
};
static const char *const real_names[R_N] = {
    "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetIndex", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetRunningProcessDetailList", "nvmlSystemGetProcessName", "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
};
static void *_Atomic real_fns[R_N];

/* The real function: the one dlsym found where the program looked it up, else libnvidia-ml's. */
static void *real(enum real_id id)
{
    void *fn = atomic_load(&real_fns[id]);
    if (fn)
        return fn;
    nvshare_driver_prepare();
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib) {
        fn = nvshare_real_dlsym(lib, real_names[id]);
        dlclose(lib);
    }
    if (!fn)
        fn = nvshare_real_dlsym(RTLD_NEXT, real_names[id]);
    if (fn)
        atomic_store(&real_fns[id], fn);
    return fn;
}

typedef nvmlReturn_t (*count_fn)(unsigned int *);
typedef nvmlReturn_t (*by_index_fn)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*by_uuid_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*uuid_fn)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*index_fn)(nvmlDevice_t, unsigned int *);
typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, void *);
typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, void *);
typedef nvmlReturn_t (*detail_fn)(nvmlDevice_t, struct nvml_proc_detail_list_v1 *);

/* ---- the job's view: which GPUs, which processes ---------------------------------------------- */
static pthread_once_t view_once = PTHREAD_ONCE_INIT;
static int view_active;            /* in a managed job */
static int n_visible = -1;         /* -1: CUDA_VISIBLE_DEVICES does not name GPUs by UUID */
static char visible[NVSHARE_MAX_GPUS][UUID_BUF];
static char job_cgroup[64];        /* "/job_<id>" when this process sits in a Slurm job cgroup */

static void read_job_cgroup(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return;
    char line[1024];
    char want[32];
    snprintf(want, sizeof want, "/job_%u", nvshare_cfg.job_id);
    while (fgets(line, sizeof line, f)) {
        char *at = strstr(line, want);
        if (at && (at[strlen(want)] == '/' || at[strlen(want)] == '\n' || at[strlen(want)] == '\0')) {
            nvshare_copy_str(job_cgroup, sizeof job_cgroup, want);
            break;
        }
    }
    fclose(f);
}

static void read_view(void)
{
    nvshare_driver_prepare();
    view_active = nvshare_cfg.active;
    if (!view_active)
        return;
    read_job_cgroup();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd || strncmp(cvd, "GPU-", 4) != 0)
        return;
    int n = 0;
    const char *p = cvd;
    while (*p && n < NVSHARE_MAX_GPUS) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= UUID_BUF || strncmp(p, "GPU-", 4) != 0)
            return;  /* not a plain UUID list: leave NVML's numbering alone */
        memcpy(visible[n], p, len);
        visible[n][len] = '\0';
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    n_visible = n;
}

static int active(void)
{
    pthread_once(&view_once, read_view);
    return view_active;
}

/* 1 when the file's text has `needle` as a whole component ending in '/', '\n', ',' or the end. */
static int has_component(const char *text, const char *needle)
{
    size_t len = strlen(needle);
    for (const char *at = strstr(text, needle); at; at = strstr(at + 1, needle)) {
        char next = at[len];
        if (next == '/' || next == '\n' || next == '\0')
            return 1;
    }
    return 0;
}

static ssize_t read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

/* 1 when pid is one of this job's processes (the header says how that is decided). */
static int in_job(unsigned int pid)
{
    if (pid == (unsigned int)getpid())
        return 1;
    char path[64], buf[16384];
    if (job_cgroup[0]) {
        snprintf(path, sizeof path, "/proc/%u/cgroup", pid);
        return read_file(path, buf, sizeof buf) > 0 && has_component(buf, job_cgroup);
    }
    snprintf(path, sizeof path, "/proc/%u/environ", pid);
    ssize_t n = read_file(path, buf, sizeof buf);
    if (n <= 0)
        return 0;
    char want_nv[48], want_slurm[48];
    snprintf(want_nv, sizeof want_nv, "NVSHARE_JOB_ID=%u", nvshare_cfg.job_id);
    snprintf(want_slurm, sizeof want_slurm, "SLURM_JOB_ID=%u", nvshare_cfg.job_id);
    for (const char *e = buf; e < buf + n; e += strlen(e) + 1)
        if (strcmp(e, want_nv) == 0 || strcmp(e, want_slurm) == 0)
            return 1;
    return 0;
}

/* 1 when dev is a GPU this job's sharing covers; its UUID in uuid. */
static int managed(nvmlDevice_t dev, char *uuid)
{
    uuid_fn get_uuid = (uuid_fn)real(R_UUID);
    if (!get_uuid || get_uuid(dev, uuid, UUID_BUF) != NVML_SUCCESS)
        return 0;
    return nvshare_gpu_is_managed(uuid);
}

/* ---- process lists ---------------------------------------------------------------------------- */
/* Calls a list function into a buffer of its own, growing it as NVML asks (entries of `stride` bytes,
 * the pid first). Returns NVML's code; on success *out (malloc'd) holds *n entries. */
static nvmlReturn_t fetch_list(procs_fn fn, nvmlDevice_t dev, size_t stride, char **out, unsigned int *n)
{
    unsigned int cap = 64;
    for (int tries = 0; tries < 6; tries++) {
        char *buf = calloc(cap, stride);
        if (!buf)
            return NVML_ERROR_UNKNOWN;
        unsigned int got = cap;
        nvmlReturn_t rc = fn(dev, &got, buf);
        if (rc == NVML_SUCCESS) {
            *out = buf;
            *n = got;
            return rc;
        }
        free(buf);
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
            return rc;
        cap = got > cap ? got + 16 : cap * 2;
    }
    return NVML_ERROR_UNKNOWN;
}

/* Keeps the job's entries of list (n entries) in place; returns how many. */
static unsigned int keep_job(char *list, unsigned int n, size_t stride)
{
    unsigned int kept = 0;
    for (unsigned int i = 0; i < n; i++) {
        unsigned int pid;
        memcpy(&pid, list + (size_t)i * stride, sizeof pid);
        if (!in_job(pid))
            continue;
        if (kept != i)
            memmove(list + (size_t)kept * stride, list + (size_t)i * stride, stride);
        kept++;
    }
    return kept;
}

/* Hands `kept` entries to the caller with NVML's size contract. */
static nvmlReturn_t give(const char *list, unsigned int kept, size_t stride, unsigned int *count, void *infos)
{
    if (kept > *count) {
        *count = kept;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (kept)
        memcpy(infos, list, (size_t)kept * stride);
    *count = kept;
    return NVML_SUCCESS;
}

static nvmlReturn_t job_list(enum real_id id, size_t stride, nvmlDevice_t dev, unsigned int *count, void *infos)
{
    procs_fn fn = (procs_fn)real(id);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    char uuid[UUID_BUF];
    if (!active() || !count || !managed(dev, uuid))
        return fn(dev, count, infos);
    char *list = NULL;
    unsigned int n = 0;
    nvmlReturn_t rc = fetch_list(fn, dev, stride, &list, &n);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int kept = keep_job(list, n, stride);
    rc = give(list, kept, stride, count, infos);
    free(list);
    return rc;
}

/* The bytes the job's processes hold on dev (compute and graphics, each pid once); -1 when unknown. */
static long long job_used(nvmlDevice_t dev)
{
    static const enum real_id lists[2][3] = {{R_COMPUTE_V3, R_COMPUTE_V2, R_COMPUTE},
                                             {R_GRAPHICS_V3, R_GRAPHICS_V2, R_GRAPHICS}};
    unsigned int pids[512];
    unsigned int n_pids = 0;
    long long used = 0;
    int known = 0;
    for (int l = 0; l < 2; l++) {
        for (int v = 0; v < 3; v++) {
            procs_fn fn = (procs_fn)real(lists[l][v]);
            if (!fn)
                continue;
            size_t stride = v == 2 ? sizeof(struct nvml_proc_v1) : sizeof(struct nvml_proc_v2);
            char *list = NULL;
            unsigned int n = 0;
            if (fetch_list(fn, dev, stride, &list, &n) != NVML_SUCCESS)
                continue;   /* an older driver may lack this version: try the next */
            known = 1;
            n = keep_job(list, n, stride);
            for (unsigned int i = 0; i < n; i++) {
                struct nvml_proc_v1 e;   /* pid and used lead every layout */
                memcpy(&e.pid, list + (size_t)i * stride, sizeof e.pid);
                memcpy(&e.used, list + (size_t)i * stride + offsetof(struct nvml_proc_v1, used), sizeof e.used);
                int seen = 0;
                for (unsigned int k = 0; k < n_pids; k++)
                    seen |= pids[k] == e.pid;
                if (seen || n_pids == sizeof pids / sizeof pids[0])
                    continue;
                pids[n_pids++] = e.pid;
                /* NVML_VALUE_NOT_AVAILABLE (all ones) where the driver cannot tell. */
                if (e.used != ~0ULL)
                    used += (long long)e.used;
            }
            free(list);
            break;
        }
    }
    return known ? used : -1;
}

/* ---- the wrappers ----------------------------------------------------------------------------- */
static nvmlReturn_t count_view(enum real_id id, unsigned int *count)
{
    count_fn fn = (count_fn)real(id);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!active() || n_visible < 0 || !count)
        return fn(count);
    unsigned int all = 0;
    nvmlReturn_t rc = fn(&all);    /* NVML's verdict first: uninitialised stays uninitialised */
    if (rc != NVML_SUCCESS)
        return rc;
    *count = (unsigned int)n_visible;
    return NVML_SUCCESS;
}

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return count_view(R_COUNT, count); }
NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return count_view(R_COUNT_V2, count); }

static nvmlReturn_t by_index_view(enum real_id id, unsigned int index, nvmlDevice_t *dev)
{
    by_index_fn fn = (by_index_fn)real(id);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!active() || n_visible < 0)
        return fn(index, dev);
    by_uuid_fn by_uuid = (by_uuid_fn)real(R_BY_UUID);
    if (!dev || index >= (unsigned int)n_visible || !by_uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    return by_uuid(visible[index], dev);
}

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *dev)
{
    return by_index_view(R_BY_INDEX, index, dev);
}

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev)
{
    return by_index_view(R_BY_INDEX_V2, index, dev);
}

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index)
{
    index_fn fn = (index_fn)real(R_INDEX);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = fn(dev, index);
    if (rc != NVML_SUCCESS || !active() || n_visible < 0)
        return rc;
    char uuid[UUID_BUF];
    uuid_fn get_uuid = (uuid_fn)real(R_UUID);
    if (!get_uuid || get_uuid(dev, uuid, sizeof uuid) != NVML_SUCCESS)
        return rc;
    for (int i = 0; i < n_visible; i++)
        if (strcmp(uuid, visible[i]) == 0) {
            *index = (unsigned int)i;
            break;
        }
    return rc;
}

/* The job's view of dev's memory: total capped by NVSHARE_MEM_LIMIT, used by the job. */
static void job_memory(nvmlDevice_t dev, unsigned long long *total, unsigned long long *free_b,
                       unsigned long long *used, unsigned long long *reserved)
{
    long long mine = job_used(dev);
    if (nvshare_cfg.mem_limit && nvshare_cfg.mem_limit < *total) {
        *total = nvshare_cfg.mem_limit;
        if (reserved)
            *reserved = 0;
    }
    unsigned long long base = reserved ? *reserved : 0;
    if (mine >= 0)
        *used = (unsigned long long)mine;
    if (*used + base > *total)
        *used = *total > base ? *total - base : 0;
    unsigned long long left = *total - base - *used;
    if (*free_b > left)
        *free_b = left;
}

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, struct nvml_memory_v1 *mem)
{
    mem_fn fn = (mem_fn)real(R_MEM);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = fn(dev, mem);
    char uuid[UUID_BUF];
    if (rc == NVML_SUCCESS && mem && active() && managed(dev, uuid))
        job_memory(dev, &mem->total, &mem->free, &mem->used, NULL);
    return rc;
}

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, struct nvml_memory_v2 *mem)
{
    mem_fn fn = (mem_fn)real(R_MEM_V2);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = fn(dev, mem);
    char uuid[UUID_BUF];
    if (rc == NVML_SUCCESS && mem && active() && managed(dev, uuid))
        job_memory(dev, &mem->total, &mem->free, &mem->used, &mem->reserved);
    return rc;
}

#define PROC_LIST(name, id, type)                                                                \
    NVSHARE_EXPORT nvmlReturn_t name(nvmlDevice_t dev, unsigned int *count, type *infos)         \
    {                                                                                            \
        return job_list(id, sizeof(type), dev, count, infos);                                    \
    }
PROC_LIST(nvmlDeviceGetComputeRunningProcesses, R_COMPUTE, struct nvml_proc_v1)
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v2, R_COMPUTE_V2, struct nvml_proc_v2)
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v3, R_COMPUTE_V3, struct nvml_proc_v2)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses, R_GRAPHICS, struct nvml_proc_v1)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, R_GRAPHICS_V2, struct nvml_proc_v2)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, R_GRAPHICS_V3, struct nvml_proc_v2)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses, R_MPS, struct nvml_proc_v1)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, R_MPS_V2, struct nvml_proc_v2)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, R_MPS_V3, struct nvml_proc_v2)

NVSHARE_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t dev,
                                                                  struct nvml_proc_detail_list_v1 *plist)
{
    detail_fn fn = (detail_fn)real(R_DETAIL);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    char uuid[UUID_BUF];
    /* Only the layout this file knows (version 1, nvmlProcessDetailList_v1) is filtered. */
    if (!active() || !plist || (plist->version >> 24) != 1 || !managed(dev, uuid))
        return fn(dev, plist);
    const size_t stride = sizeof(struct nvml_proc_detail_v1);
    unsigned int cap = 64;
    for (int tries = 0; tries < 6; tries++) {
        struct nvml_proc_detail_list_v1 own = *plist;
        own.count = cap;
        own.procs = calloc(cap, stride);
        if (!own.procs)
            return NVML_ERROR_UNKNOWN;
        nvmlReturn_t rc = fn(dev, &own);
        if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
            cap = own.count > cap ? own.count + 16 : cap * 2;
            free(own.procs);
            continue;
        }
        if (rc == NVML_SUCCESS) {
            unsigned int kept = keep_job((char *)own.procs, own.count, stride);
            rc = give((const char *)own.procs, kept, stride, &plist->count, plist->procs);
        }
        free(own.procs);
        return rc;
    }
    return NVML_ERROR_UNKNOWN;
}

/* nvidia-smi (driver 580) takes its process table from NVML's private export table, which this file
 * does not touch, and then names each pid here: another job's process keeps its pid and memory in
 * that table, but not its name (NVML's answer for a process that is gone). */
NVSHARE_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    typedef nvmlReturn_t (*name_fn)(unsigned int, char *, unsigned int);
    name_fn fn = (name_fn)real(R_PROC_NAME);
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (active() && !in_job(pid))
        return NVML_ERROR_NOT_FOUND;
    return fn(pid, name, length);
}

/* ---- dlsym ------------------------------------------------------------------------------------ */
static const struct { const char *name; enum real_id id; void *wrapper; } wrapped[] = {
    {"nvmlDeviceGetCount", R_COUNT, (void *)nvmlDeviceGetCount},
    {"nvmlDeviceGetCount_v2", R_COUNT_V2, (void *)nvmlDeviceGetCount_v2},
    {"nvmlDeviceGetHandleByIndex", R_BY_INDEX, (void *)nvmlDeviceGetHandleByIndex},
    {"nvmlDeviceGetHandleByIndex_v2", R_BY_INDEX_V2, (void *)nvmlDeviceGetHandleByIndex_v2},
    {"nvmlDeviceGetIndex", R_INDEX, (void *)nvmlDeviceGetIndex},
    {"nvmlDeviceGetMemoryInfo", R_MEM, (void *)nvmlDeviceGetMemoryInfo},
    {"nvmlDeviceGetMemoryInfo_v2", R_MEM_V2, (void *)nvmlDeviceGetMemoryInfo_v2},
    {"nvmlDeviceGetComputeRunningProcesses", R_COMPUTE, (void *)nvmlDeviceGetComputeRunningProcesses},
    {"nvmlDeviceGetComputeRunningProcesses_v2", R_COMPUTE_V2, (void *)nvmlDeviceGetComputeRunningProcesses_v2},
    {"nvmlDeviceGetComputeRunningProcesses_v3", R_COMPUTE_V3, (void *)nvmlDeviceGetComputeRunningProcesses_v3},
    {"nvmlDeviceGetGraphicsRunningProcesses", R_GRAPHICS, (void *)nvmlDeviceGetGraphicsRunningProcesses},
    {"nvmlDeviceGetGraphicsRunningProcesses_v2", R_GRAPHICS_V2, (void *)nvmlDeviceGetGraphicsRunningProcesses_v2},
    {"nvmlDeviceGetGraphicsRunningProcesses_v3", R_GRAPHICS_V3, (void *)nvmlDeviceGetGraphicsRunningProcesses_v3},
    {"nvmlDeviceGetMPSComputeRunningProcesses", R_MPS, (void *)nvmlDeviceGetMPSComputeRunningProcesses},
    {"nvmlDeviceGetMPSComputeRunningProcesses_v2", R_MPS_V2, (void *)nvmlDeviceGetMPSComputeRunningProcesses_v2},
    {"nvmlDeviceGetMPSComputeRunningProcesses_v3", R_MPS_V3, (void *)nvmlDeviceGetMPSComputeRunningProcesses_v3},
    {"nvmlDeviceGetRunningProcessDetailList", R_DETAIL, (void *)nvmlDeviceGetRunningProcessDetailList},
    {"nvmlSystemGetProcessName", R_PROC_NAME, (void *)nvmlSystemGetProcessName},
};

void *nvshare_nvml_wrapper(void *handle, const char *name)
{
    /* RTLD_NEXT means "after the caller": only the real dlsym, called from the caller, knows that. */
    if (handle == RTLD_NEXT || !active())
        return NULL;
    for (size_t i = 0; i < sizeof wrapped / sizeof wrapped[0]; i++) {
        if (strcmp(name, wrapped[i].name) != 0)
            continue;
        void *fn = nvshare_real_dlsym(handle, name);
        if (!fn)
            return NULL;   /* the library lacks it: let the real dlsym say so */
        atomic_store(&real_fns[wrapped[i].id], fn);
        /* The helpers this file calls itself come from the same library. */
        if (!atomic_load(&real_fns[R_UUID]))
            atomic_store(&real_fns[R_UUID], nvshare_real_dlsym(handle, real_names[R_UUID]));
        if (!atomic_load(&real_fns[R_BY_UUID]))
            atomic_store(&real_fns[R_BY_UUID], nvshare_real_dlsym(handle, real_names[R_BY_UUID]));
        return wrapped[i].wrapper;
    }
    return NULL;
}
