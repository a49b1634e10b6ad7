/* A fake libnvidia-ml.so.1 for the tests of csrc/nvml.c: enough of NVML for nvidia-smi-like readers.
 *
 * FAKE_NVML_DEVICES: "UUID:TOTAL:FREE,..." in bytes or with K/M/G (default: the two GPUs of
 * tests/conftest.py, 16G each, 12G free). FAKE_NVML_PROCS: "UUID:PID:BYTES,...": the processes every
 * running-process call lists for that GPU (compute; graphics lists are empty); PID "self" is the
 * calling process. Handles are pointers
 * to the device records. nvmlInit must come first, as with the real library.
 * FAKE_NVML_FROM_CUDA=1: the devices are the fake CUDA driver's (FAKE_CUDA_DEVICES, "UUID:SIZE,...")
 * and their used memory and processes are what its FAKE_CUDA_SHARED_MEMORY file holds
 * (fake_memory.h): a process that ended is listed until the driver has released its memory, as
 * nvidia-smi shows on a real GPU.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_memory.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 8
#define MAX_PROC 64
#define OK 0
#define E_UNINIT 1
#define E_INVALID 2
#define E_NOT_FOUND 6
#define E_SIZE 7

struct dev { char uuid[96]; unsigned long long total, free; unsigned index; };
struct proc { int dev; unsigned pid; unsigned long long used; };
static struct dev devs[MAX_DEV];
static struct proc procs[MAX_PROC];
static int n_devs, n_procs, inited;
static struct fake_memory *from_cuda;   /* FAKE_NVML_FROM_CUDA=1: the fake driver's shared memory */

static unsigned long long size_of(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return v;
    }
}

/* FAKE_NVML_FROM_CUDA=1: the fake driver's devices and its shared memory file. */
static int parse_from_cuda(void)
{
    const char *on = getenv("FAKE_NVML_FROM_CUDA"), *path = getenv("FAKE_CUDA_SHARED_MEMORY");
    if (!on || strcmp(on, "1") != 0 || !path || !*path)
        return 0;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_size >= (off_t)sizeof *from_cuda
                                || ftruncate(fd, sizeof *from_cuda) == 0)) {
        void *p = mmap(NULL, sizeof *from_cuda, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED)
            from_cuda = p;
    }
    close(fd);
    if (!from_cuda)
        return 0;
    const char *spec = getenv("FAKE_CUDA_DEVICES");
    if (!spec || !*spec)
        spec = "GPU-fa4e0000-0000-0000-0000-000000000000:16G,GPU-fa4e0000-0000-0000-0000-000000000001:16G";
    char *copy = strdup(spec), *save = NULL;
    for (char *e = strtok_r(copy, ",", &save); e && n_devs < MAX_DEV; e = strtok_r(NULL, ",", &save)) {
        char *c1 = strchr(e, ':');
        if (c1)
            *c1 = '\0';
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;   /* a device file: not NVML's business */
        if (c2)
            *c2 = '\0';
        struct dev *d = &devs[n_devs];
        snprintf(d->uuid, sizeof d->uuid, "%s", e);
        d->total = c1 && c1[1] ? size_of(c1 + 1) : 16ULL << 30;
        d->index = (unsigned)n_devs++;
    }
    free(copy);
    return 1;
}

/* With FAKE_NVML_FROM_CUDA: the processes holding memory on each device now, from the shared file. */
static void load_from_cuda(void)
{
    fake_reap(from_cuda);
    uint64_t now = fake_now_ns();
    n_procs = 0;
    for (int i = 0; i < FAKE_SLOTS && n_procs < MAX_PROC; i++) {
        struct fake_slot *s = &from_cuda->slots[i];
        if (!fake_slot_held(s, now) || s->dev < 0 || s->dev >= n_devs)
            continue;
        procs[n_procs].dev = s->dev;
        procs[n_procs].pid = (unsigned)s->pid;
        procs[n_procs].used = __atomic_load_n(&s->bytes, __ATOMIC_SEQ_CST);
        n_procs++;
    }
    for (int d = 0; d < n_devs; d++) {
        uint64_t used = __atomic_load_n(&from_cuda->used[d], __ATOMIC_SEQ_CST);
        devs[d].free = used < devs[d].total ? devs[d].total - used : 0;
    }
}

static void parse(void)
{
    if (parse_from_cuda())
        return;
    const char *spec = getenv("FAKE_NVML_DEVICES");
    if (!spec || !*spec)
        spec = "GPU-fa4e0000-0000-0000-0000-000000000000:16G:12G,"
               "GPU-fa4e0000-0000-0000-0000-000000000001:16G:12G";
    char *copy = strdup(spec), *save = NULL;
    for (char *e = strtok_r(copy, ",", &save); e && n_devs < MAX_DEV; e = strtok_r(NULL, ",", &save)) {
        char *c1 = strchr(e, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = '\0';
        struct dev *d = &devs[n_devs];
        snprintf(d->uuid, sizeof d->uuid, "%s", e);
        d->total = size_of(c1 + 1);
        d->free = size_of(c2 + 1);
        d->index = (unsigned)n_devs++;
    }
    free(copy);
    const char *ps = getenv("FAKE_NVML_PROCS");
    if (!ps)
        return;
    copy = strdup(ps);
    save = NULL;
    for (char *e = strtok_r(copy, ",", &save); e && n_procs < MAX_PROC; e = strtok_r(NULL, ",", &save)) {
        char *c1 = strchr(e, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = '\0';
        for (int i = 0; i < n_devs; i++)
            if (strcmp(devs[i].uuid, e) == 0) {
                procs[n_procs].dev = i;
                procs[n_procs].pid = strcmp(c1 + 1, "self") == 0 ? (unsigned)getpid()
                                                                 : (unsigned)strtoul(c1 + 1, NULL, 10);
                procs[n_procs].used = size_of(c2 + 1);
                n_procs++;
            }
    }
    free(copy);
}

EXPORT int nvmlInit_v2(void) { if (!inited) parse(); inited = 1; return OK; }
EXPORT int nvmlInit(void) { return nvmlInit_v2(); }
EXPORT int nvmlInitWithFlags(unsigned flags) { return nvmlInit_v2(); }
EXPORT int nvmlShutdown(void) { return OK; }

EXPORT int nvmlDeviceGetCount_v2(unsigned *count)
{
    if (!inited) return E_UNINIT;
    if (!count) return E_INVALID;
    *count = (unsigned)n_devs;
    return OK;
}
EXPORT int nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned index, struct dev **dev)
{
    if (!inited) return E_UNINIT;
    if (!dev || index >= (unsigned)n_devs) return E_INVALID;
    *dev = &devs[index];
    return OK;
}
EXPORT int nvmlDeviceGetHandleByIndex(unsigned index, struct dev **dev)
{
    return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, struct dev **dev)
{
    if (!inited) return E_UNINIT;
    for (int i = 0; i < n_devs; i++)
        if (strcmp(devs[i].uuid, uuid) == 0) {
            *dev = &devs[i];
            return OK;
        }
    return E_NOT_FOUND;
}

EXPORT int nvmlDeviceGetUUID(struct dev *dev, char *buf, unsigned len)
{
    if (!dev || !buf || len < strlen(dev->uuid) + 1) return E_INVALID;
    strcpy(buf, dev->uuid);
    return OK;
}

EXPORT int nvmlDeviceGetIndex(struct dev *dev, unsigned *index)
{
    if (!dev || !index) return E_INVALID;
    *index = dev->index;
    return OK;
}

struct mem_v1 { unsigned long long total, free, used; };
struct mem_v2 { unsigned version; unsigned long long total, reserved, free, used; };

EXPORT int nvmlDeviceGetMemoryInfo(struct dev *dev, struct mem_v1 *m)
{
    if (!dev || !m) return E_INVALID;
    if (from_cuda)
        load_from_cuda();
    m->total = dev->total;
    m->free = dev->free;
    m->used = dev->total - dev->free;
    return OK;
}

EXPORT int nvmlDeviceGetMemoryInfo_v2(struct dev *dev, struct mem_v2 *m)
{
    if (!dev || !m) return E_INVALID;
    if (from_cuda)
        load_from_cuda();
    m->reserved = 512ULL << 20;
    m->total = dev->total;
    m->free = dev->free;
    m->used = dev->total - dev->free - m->reserved;
    return OK;
}

struct proc_v1 { unsigned pid; unsigned long long used; };
struct proc_v2 { unsigned pid; unsigned long long used; unsigned gi, ci; };

static int list(struct dev *dev, unsigned *count, void *infos, int v1)
{
    if (!dev || !count) return E_INVALID;
    if (from_cuda)
        load_from_cuda();
    unsigned n = 0;
    for (int i = 0; i < n_procs; i++)
        n += &devs[procs[i].dev] == dev;
    if (n > *count) {
        *count = n;
        return E_SIZE;
    }
    unsigned k = 0;
    for (int i = 0; i < n_procs; i++) {
        if (&devs[procs[i].dev] != dev)
            continue;
        if (v1) {
            struct proc_v1 *p = (struct proc_v1 *)infos + k;
            p->pid = procs[i].pid;
            p->used = procs[i].used;
        } else {
            struct proc_v2 *p = (struct proc_v2 *)infos + k;
            p->pid = procs[i].pid;
            p->used = procs[i].used;
            p->gi = p->ci = 0xFFFFFFFFu;
        }
        k++;
    }
    *count = n;
    return OK;
}

EXPORT int nvmlDeviceGetComputeRunningProcesses(struct dev *d, unsigned *c, void *i) { return list(d, c, i, 1); }
EXPORT int nvmlDeviceGetComputeRunningProcesses_v2(struct dev *d, unsigned *c, void *i) { return list(d, c, i, 0); }
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(struct dev *d, unsigned *c, void *i) { return list(d, c, i, 0); }

static int empty(struct dev *d, unsigned *c)
{
    if (!d || !c) return E_INVALID;
    *c = 0;
    return OK;
}
EXPORT int nvmlDeviceGetGraphicsRunningProcesses(struct dev *d, unsigned *c, void *i) { return empty(d, c); }
EXPORT int nvmlDeviceGetGraphicsRunningProcesses_v2(struct dev *d, unsigned *c, void *i) { return empty(d, c); }
EXPORT int nvmlDeviceGetGraphicsRunningProcesses_v3(struct dev *d, unsigned *c, void *i) { return empty(d, c); }

struct detail { unsigned pid; unsigned long long used; unsigned gi, ci; unsigned long long cc; };
struct detail_list { unsigned version, mode, count; struct detail *procs; };

EXPORT int nvmlDeviceGetRunningProcessDetailList(struct dev *dev, struct detail_list *l)
{
    if (!dev || !l) return E_INVALID;
    if (l->mode != 0) {  /* graphics, MPS: none here */
        l->count = 0;
        return OK;
    }
    unsigned n = 0;
    for (int i = 0; i < n_procs; i++)
        n += &devs[procs[i].dev] == dev;
    if (n > l->count || !l->procs) {
        unsigned had = l->count;
        l->count = n;
        return n > had ? E_SIZE : OK;
    }
    unsigned k = 0;
    for (int i = 0; i < n_procs; i++)
        if (&devs[procs[i].dev] == dev) {
            l->procs[k].pid = procs[i].pid;
            l->procs[k].used = procs[i].used;
            l->procs[k].gi = l->procs[k].ci = 0xFFFFFFFFu;
            l->procs[k].cc = 0;
            k++;
        }
    l->count = n;
    return OK;
}

EXPORT int nvmlSystemGetProcessName(unsigned pid, char *name, unsigned length)
{
    if (!name || length < 2) return E_INVALID;
    snprintf(name, length, "proc%u", pid);
    return OK;
}

/* Not interposed by the hook: must pass through untouched. */
EXPORT int nvmlDeviceGetName(struct dev *dev, char *buf, unsigned len)
{
    if (!dev || !buf || len < 16) return E_INVALID;
    snprintf(buf, len, "Fake GPU %u", dev->index);
    return OK;
}

EXPORT int nvmlDeviceGetMinorNumber(struct dev *dev, unsigned *minor)
{
    if (!dev || !minor) return E_INVALID;
    *minor = dev->index;
    return OK;
}
