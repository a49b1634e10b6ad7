/* swap.c: device memory that can leave the GPU and come back at the same address.
 *
 * An allocation of at least the virtual-memory granularity (2 MiB on current GPUs) is made as one
 * address reservation with physical memory mapped under it in chunks. Swapping out copies chunks to
 * pinned host memory and releases their physical memory; the reservation stays, so every pointer the
 * application holds stays valid. Swapping in re-creates the physical memory, maps it at the same
 * address and copies the data back. Chunks let a hand-over move only the bytes the next job needs.
 *
 * gate.c calls swap-out and swap-in with the GPU's gate shut and this process's work on it drained,
 * under swap_mu, so no kernel and no other hook path touches memory in motion. The pinned copy is kept
 * for the next swap: pinning is the slow part (seconds for tens of GB), copying runs at bus speed.
 * Host memory for swap counts against the job: before pinning, the cgroup's limit is checked, so a
 * job whose limit cannot hold its swap keeps its memory on the GPU and says so, instead of being
 * killed by the OOM killer.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "env.h"
#include "gpus.h"
#include "hostpin.h"
#include "swap.h"

#define CHUNK_BYTES (256ull << 20)
/* Host memory kept free beyond what a swap pins: the job needs some for itself. */
#define HOST_MARGIN_BYTES (256ull << 20)
/* Pinned copies are kept after a swap-in for the next swap-out (pinning is the slow part), but only
 * while the job's cgroup and the node keep this much free: they are the job's host memory. */
#define PINNED_KEEP_HEADROOM_BYTES (1ull << 30)

struct nvshare_swap_entry {
    CUdeviceptr base;                     /* the allocation's address, what cuMemFree gets */
    CUdeviceptr va;                       /* this chunk */
    size_t size;
    CUmemGenericAllocationHandle handle;  /* physical memory while resident */
    void *host;                           /* pinned copy, kept between swaps (hostpin.c) */
    int host_mapped;                      /* how it was pinned: nvshare_host_unpin needs it */
    int resident;
    int has_data;                         /* host holds the contents; else born swapped */
    unsigned clean;                       /* born swapped, made resident by a prefetch: gate.opens + 1
                                           * then; while it still is, no work has written it */
    int fixed;                            /* stays on the GPU: exported for CUDA IPC (another process maps
                                           * it), or the driver would not unmap it for a swap-out */
};

/* The counters memory.c reports: swap.c alone moves bytes between them. */
static void counted(struct nvshare_gpu *g, int64_t d_swappable, int64_t d_swapped)
{
    atomic_fetch_add(&g->swap.swappable, (uint64_t)d_swappable);
    atomic_fetch_add(&g->swap.swapped, (uint64_t)d_swapped);
}

void nvshare_swap_lock(struct nvshare_gpu *g) { pthread_mutex_lock(&g->swap.mu); }
void nvshare_swap_unlock(struct nvshare_gpu *g) { pthread_mutex_unlock(&g->swap.mu); }
void nvshare_swap_set_abort(struct nvshare_gpu *g, int on) { atomic_store(&g->swap.abort, on); }
int nvshare_swap_keep_resident(struct nvshare_gpu *g) { return !atomic_exchange(&g->swap.peer_access, 1); }

static CUmemAllocationProp device_prop(const struct nvshare_gpu *g)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g->device;
    prop.allocFlags.gpuDirectRDMACapable = (unsigned char)g->swap.rdma;
    /* The driver exports a chunk (CUDA IPC, ipc.c) only when it was made exportable. */
    if (g->swap.fd_export)
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

/* With swap_mu held: can g's allocations be backed this way? Found out once per GPU. */
static int vmm_usable(struct nvshare_gpu *g)
{
    if (g->swap.vmm >= 0)
        return g->swap.vmm;
    g->swap.vmm = 0;
    const struct nvshare_real *r = &nvshare_real;
    if (!r->cuDeviceGetAttribute || !r->cuMemGetAllocationGranularity || !r->cuMemAddressReserve ||
        !r->cuMemAddressFree || !r->cuMemMap || !r->cuMemUnmap || !r->cuMemSetAccess || !r->cuMemCreate ||
        !r->cuMemRelease || !r->cuMemHostAlloc || !r->cuMemFreeHost || !r->cuMemcpyDtoH_v2 ||
        !r->cuMemcpyHtoD_v2) {
        nvshare_debug("gpu %s: the driver lacks the virtual memory calls; allocations stay fixed", g->uuid);
        return 0;
    }
    nvshare_in_hook++;
    int supported = 0, rdma = 0;
    size_t granularity = 0;
    if (r->cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, g->device) ==
        CUDA_SUCCESS)
        g->swap.rdma = rdma != 0;
    int fd_export = 0;
    if (r->cuMemExportToShareableHandle &&
        r->cuDeviceGetAttribute(&fd_export, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                g->device) == CUDA_SUCCESS)
        g->swap.fd_export = fd_export != 0;
    CUmemAllocationProp prop = device_prop(g);
    if (r->cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                g->device) == CUDA_SUCCESS && supported &&
        r->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
            CUDA_SUCCESS && granularity && CHUNK_BYTES % granularity == 0) {
        g->swap.granularity = granularity;
        /* Every chunk asks for the fd handle type: make sure cuMemCreate takes it here, or every
         * swappable allocation would fail; without it only CUDA IPC on this memory is lost. */
        CUmemGenericAllocationHandle probe;
        if (g->swap.fd_export && r->cuMemCreate(&probe, granularity, &prop, 0) == CUDA_SUCCESS) {
            r->cuMemRelease(probe);
        } else if (g->swap.fd_export) {
            g->swap.fd_export = 0;
            prop = device_prop(g);
            nvshare_log("gpu %s: its memory cannot be made exportable; CUDA IPC on swappable memory "
                        "is off (NVSHARE_SWAP=off gives the driver's own IPC)", g->uuid);
        }
        /* Like cuMemAlloc: read-write for this GPU and for every GPU that can reach it as a peer. */
        g->swap.n_access = 0;
        g->swap.access[g->swap.n_access++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, g->device},
                                                     CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        int count = 0;
        if (r->cuDeviceGetCount && r->cuDeviceCanAccessPeer && r->cuDeviceGetCount(&count) == CUDA_SUCCESS)
            for (int d = 0; d < count && g->swap.n_access < NVSHARE_MAX_GPUS; d++) {
                int can = 0;
                if (d != g->device && r->cuDeviceCanAccessPeer(&can, d, g->device) == CUDA_SUCCESS && can)
                    g->swap.access[g->swap.n_access++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, d},
                                                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            }
        g->swap.vmm = 1;
    } else {
        nvshare_debug("gpu %s: no virtual memory management on this GPU; allocations stay fixed", g->uuid);
    }
    nvshare_in_hook--;
    return g->swap.vmm;
}

size_t nvshare_swap_size(struct nvshare_gpu *g, size_t size)
{
    if (!g || !nvshare_cfg.active || !nvshare_cfg.swap || atomic_load(&g->mode) == GPU_PASS ||
        atomic_load(&g->swap.peer_access))
        return 0;
    size_t rounded = 0;
    pthread_mutex_lock(&g->swap.mu);
    if (vmm_usable(g) && size >= g->swap.granularity && size <= SIZE_MAX - g->swap.granularity)
        rounded = (size + g->swap.granularity - 1) / g->swap.granularity * g->swap.granularity;
    pthread_mutex_unlock(&g->swap.mu);
    return rounded;
}

/* With swap_mu held. */
static CUresult map_physical(struct nvshare_gpu *g, struct nvshare_swap_entry *e)
{
    const struct nvshare_real *r = &nvshare_real;
    CUmemAllocationProp prop = device_prop(g);
    CUmemGenericAllocationHandle handle;
    CUresult rc = r->cuMemCreate(&handle, e->size, &prop, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = r->cuMemMap(e->va, e->size, 0, handle, 0);
    if (rc != CUDA_SUCCESS) {
        r->cuMemRelease(handle);
        return rc;
    }
    rc = r->cuMemSetAccess(e->va, e->size, g->swap.access, (size_t)g->swap.n_access);
    if (rc != CUDA_SUCCESS && g->swap.n_access > 1) {
        nvshare_log("gpu %s: peer GPUs cannot be given access to its memory (CUDA error %d); only the GPU "
                    "itself can reach it from now on", g->uuid, rc);
        g->swap.n_access = 1;
        rc = r->cuMemSetAccess(e->va, e->size, g->swap.access, 1);
    }
    if (rc != CUDA_SUCCESS) {
        r->cuMemUnmap(e->va, e->size);
        r->cuMemRelease(handle);
        return rc;
    }
    e->handle = handle;
    e->resident = 1;
    return CUDA_SUCCESS;
}

/* With swap_mu held: room for n more entries. */
static int reserve_entries(struct nvshare_gpu *g, size_t n)
{
    if (g->swap.count + n <= g->swap.cap)
        return 0;
    size_t cap = g->swap.cap ? g->swap.cap : 64;
    while (cap < g->swap.count + n)
        cap *= 2;
    struct nvshare_swap_entry *grown = realloc(g->swap.entries, cap * sizeof *grown);
    if (!grown)
        return -1;
    g->swap.entries = grown;
    g->swap.cap = cap;
    return 0;
}

/* Gives a chunk's physical memory back. A chunk that cannot be unmapped stays resident (and its
 * data where it is): releasing memory still mapped would leave the address pointing nowhere known. */
static CUresult unmap_chunk(struct nvshare_gpu *g, struct nvshare_swap_entry *e)
{
    CUresult rc = nvshare_real.cuMemUnmap(e->va, e->size);
    if (rc != CUDA_SUCCESS) {
        nvshare_log("gpu %s: unmapping %zu bytes at 0x%llx failed (CUDA error %d); they stay on the GPU",
                    g->uuid, e->size, (unsigned long long)e->va, rc);
        return rc;
    }
    CUresult released = nvshare_real.cuMemRelease(e->handle);
    if (released != CUDA_SUCCESS)
        nvshare_log("gpu %s: releasing %zu bytes of GPU memory failed (CUDA error %d)", g->uuid, e->size,
                    released);
    e->handle = 0;
    e->resident = 0;
    return CUDA_SUCCESS;
}

static void start_prepin(struct nvshare_gpu *g);

/* Resident, made so by a prefetch without contents, and the gate has not opened since. */
static int untouched(struct nvshare_gpu *g, const struct nvshare_swap_entry *e)
{
    return e->resident && !e->has_data && e->clean && e->clean == atomic_load(&g->gate.opens) + 1;
}

CUresult nvshare_swap_alloc(struct nvshare_gpu *g, CUdeviceptr *dptr, size_t size, int deferred)
{
    const struct nvshare_real *r = &nvshare_real;
    size_t chunks = (size + CHUNK_BYTES - 1) / CHUNK_BYTES;
    pthread_mutex_lock(&g->swap.mu);
    if (!vmm_usable(g) || reserve_entries(g, chunks) != 0) {
        pthread_mutex_unlock(&g->swap.mu);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    nvshare_in_hook++;
    CUdeviceptr base = 0;
    CUresult rc = r->cuMemAddressReserve(&base, size, 0, 0, 0);
    if (rc != CUDA_SUCCESS) {
        nvshare_in_hook--;
        pthread_mutex_unlock(&g->swap.mu);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? rc : CUDA_ERROR_NOT_SUPPORTED;
    }
    struct nvshare_swap_entry *first = &g->swap.entries[g->swap.count];
    for (size_t i = 0; i < chunks; i++) {
        size_t offset = i * CHUNK_BYTES;
        first[i] = (struct nvshare_swap_entry){
            .base = base, .va = base + offset, .size = size - offset < CHUNK_BYTES ? size - offset : CHUNK_BYTES};
    }
    /* Born swapped only while this process cannot be running on g: the decision and the counters
     * change under the gate's mutex, where a grant looks at them before it opens the gate. */
    pthread_mutex_lock(&g->gate.mu);
    int born_swapped = deferred && !atomic_load(&g->gate.open);
    if (born_swapped) {
        g->swap.count += chunks;
        counted(g, 0, (int64_t)size);
    }
    pthread_mutex_unlock(&g->gate.mu);
    if (!born_swapped) {
        for (size_t i = 0; i < chunks && rc == CUDA_SUCCESS; i++) {
            rc = map_physical(g, &first[i]);
            if (rc != CUDA_SUCCESS)
                for (size_t j = 0; j < i; j++)
                    unmap_chunk(g, &first[j]);
        }
        if (rc == CUDA_SUCCESS) {
            g->swap.count += chunks;
            counted(g, (int64_t)size, 0);
        } else {
            r->cuMemAddressFree(base, size);
        }
    }
    if (rc == CUDA_SUCCESS && nvshare_cfg.swap_prepin == 1) {
        atomic_store(&g->swap.prepin_target, UINT64_MAX);
        start_prepin(g);
    }
    nvshare_in_hook--;
    pthread_mutex_unlock(&g->swap.mu);
    if (rc == CUDA_SUCCESS)
        *dptr = base;
    return rc;
}

struct nvshare_gpu *nvshare_swap_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
    int n = atomic_load(&nvshare_n_gpus);
    struct nvshare_gpu *found = NULL;
    for (int k = 0; k < n && !found; k++) {
        struct nvshare_gpu *g = &nvshare_gpus[k];
        pthread_mutex_lock(&g->swap.mu);
        for (size_t i = 0; i < g->swap.count && !found; i++) {
            struct nvshare_swap_entry *e = &g->swap.entries[i];
            if (ptr < e->va || ptr - e->va >= e->size)
                continue;
            found = g;
            *base = e->base;
            *size = 0;
            for (size_t j = 0; j < g->swap.count; j++)
                if (g->swap.entries[j].base == e->base)
                    *size += g->swap.entries[j].size;
        }
        pthread_mutex_unlock(&g->swap.mu);
    }
    return found;
}

int nvshare_swap_free(struct nvshare_gpu *g, CUdeviceptr va, CUresult *rc)
{
    const struct nvshare_real *r = &nvshare_real;
    pthread_mutex_lock(&g->swap.mu);
    size_t found = 0;
    for (size_t i = 0; i < g->swap.count; i++)
        found += g->swap.entries[i].base == va;
    if (!found) {
        pthread_mutex_unlock(&g->swap.mu);
        return 0;
    }
    nvshare_in_hook++;
    /* cuMemFree waits for the work that may still use the memory; unmapping does not. That work is
     * on g, whichever GPU the freeing thread has current. */
    nvshare_gpus_sync_contexts(g);
    /* Unmap first: a chunk the driver will not unmap stays mapped and tracked, and so does the
     * whole allocation, so cuMemFree reports the error and a retry can finish the job. */
    uint64_t size = 0, was_swapped = 0, unmapped_swappable = 0, unmapped_all = 0;
    CUresult unmapped = CUDA_SUCCESS;
    for (size_t i = 0; i < g->swap.count; i++) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (e->base != va)
            continue;
        size += e->size;
        if (!e->resident) {
            was_swapped += e->size;
            continue;
        }
        CUresult rc_chunk = unmap_chunk(g, e);
        if (rc_chunk != CUDA_SUCCESS) {
            if (unmapped == CUDA_SUCCESS)
                unmapped = rc_chunk;
            continue;
        }
        unmapped_all += e->size;
        if (!e->fixed)
            unmapped_swappable += e->size;
        e->fixed = 0;     /* off the GPU: what comes back is new memory */
        e->has_data = 0;  /* the application was freeing it */
    }
    if (unmapped != CUDA_SUCCESS) {
        /* Still an allocation; the chunks that did go count as swapped, as every chunk off the GPU. */
        counted(g, -(int64_t)unmapped_swappable, (int64_t)unmapped_all);
        nvshare_in_hook--;
        pthread_mutex_unlock(&g->swap.mu);
        nvshare_log("gpu %s: cuMemFree of %llu bytes at 0x%llx failed: the driver would not unmap them "
                    "(CUDA error %d); they stay allocated", g->uuid, (unsigned long long)size,
                    (unsigned long long)va, unmapped);
        *rc = unmapped;
        return 1;
    }
    size_t kept = 0;
    for (size_t i = 0; i < g->swap.count; i++) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (e->base != va) {
            g->swap.entries[kept++] = *e;
            continue;
        }
        nvshare_host_unpin(e->host, e->size, e->host_mapped);
    }
    g->swap.count = kept;
    *rc = r->cuMemAddressFree(va, size);
    nvshare_in_hook--;
    counted(g, -(int64_t)unmapped_swappable, -(int64_t)was_swapped);
    pthread_mutex_unlock(&g->swap.mu);
    return 1;
}

/* ---- CUDA IPC: exporting an allocation's chunks (ipc.c sends them) ---------------------------- */
CUresult nvshare_swap_export(struct nvshare_gpu *g, CUdeviceptr ptr, struct nvshare_swap_export *out)
{
    const struct nvshare_real *r = &nvshare_real;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&g->swap.mu);
    CUdeviceptr base = 0;
    for (size_t i = 0; i < g->swap.count && !base; i++)
        if (ptr >= g->swap.entries[i].va && ptr - g->swap.entries[i].va < g->swap.entries[i].size)
            base = g->swap.entries[i].base;
    size_t n = 0, size = 0;
    int resident = 1;
    for (size_t i = 0; i < g->swap.count; i++)
        if (base && g->swap.entries[i].base == base) {
            n++;
            size += g->swap.entries[i].size;
            resident &= g->swap.entries[i].resident;
        }
    CUresult rc = !base ? CUDA_ERROR_INVALID_VALUE
                : !g->swap.fd_export ? CUDA_ERROR_NOT_SUPPORTED
                : !resident ? CUDA_ERROR_OUT_OF_MEMORY  /* the caller is inside the gate: a swap-in failed */
                : CUDA_SUCCESS;
    int *fds = rc == CUDA_SUCCESS ? malloc(n * sizeof *fds) : NULL;
    if (rc == CUDA_SUCCESS && !fds)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    size_t done = 0;
    nvshare_in_hook++;
    for (size_t i = 0; i < g->swap.count && rc == CUDA_SUCCESS; i++) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (e->base != base)
            continue;
        int fd = -1;
        rc = r->cuMemExportToShareableHandle(&fd, e->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (rc == CUDA_SUCCESS) {
            fcntl(fd, F_SETFD, FD_CLOEXEC);  /* the job's child programs do not inherit GPU memory */
            fds[done++] = fd;
        }
    }
    nvshare_in_hook--;
    if (rc != CUDA_SUCCESS) {
        while (done)
            close(fds[--done]);
        free(fds);
        pthread_mutex_unlock(&g->swap.mu);
        return rc;
    }
    /* Another process maps these chunks from now on: they can never leave the GPU again. */
    uint64_t newly_fixed = 0;
    for (size_t i = 0; i < g->swap.count; i++) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (e->base == base && !e->fixed) {
            e->fixed = 1;
            newly_fixed += e->size;
        }
    }
    counted(g, -(int64_t)newly_fixed, 0);
    pthread_mutex_unlock(&g->swap.mu);
    *out = (struct nvshare_swap_export){base, size, CHUNK_BYTES, n, fds, newly_fixed};
    return CUDA_SUCCESS;
}

/* ---- host memory the job may still take ------------------------------------------------------ */
static int read_u64(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char buf[64] = {0};
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    if (strncmp(buf, "max", 3) == 0) {
        *out = UINT64_MAX;
        return 0;
    }
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf)
        return -1;
    *out = v;
    return 0;
}

/* The least headroom (limit - usage) of dir and its parents up to root; files named limit/usage. */
static uint64_t cgroup_headroom(const char *root, const char *path, const char *limit_name,
                                const char *usage_name)
{
    uint64_t room = UINT64_MAX;
    char dir[4096];
    if ((size_t)snprintf(dir, sizeof dir, "%s%s", root, path) >= sizeof dir)
        return room;
    size_t root_len = strlen(root);
    for (;;) {
        size_t len = strlen(dir);
        while (len > root_len && dir[len - 1] == '/')
            dir[--len] = '\0';
        char file[4200];
        uint64_t limit, usage;
        snprintf(file, sizeof file, "%s/%s", dir, limit_name);
        if (read_u64(file, &limit) == 0 && limit < (1ull << 62)) {
            snprintf(file, sizeof file, "%s/%s", dir, usage_name);
            if (read_u64(file, &usage) == 0) {
                uint64_t left = usage < limit ? limit - usage : 0;
                if (left < room)
                    room = left;
            }
        }
        char *slash = strrchr(dir, '/');
        if (len <= root_len || !slash || (size_t)(slash - dir) < root_len)
            break;
        *slash = '\0';
    }
    return room;
}

/* What this process may still pin before its cgroup (Slurm's --mem) or the node runs out. */
static uint64_t host_headroom(const char **what)
{
    uint64_t room = UINT64_MAX;
    *what = "";
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (f) {
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            char *c1 = strchr(line, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2)
                continue;
            *c2 = '\0';
            const char *controllers = c1 + 1, *path = c2 + 1;
            uint64_t left = UINT64_MAX;
            if (*controllers == '\0') {          /* cgroup v2 */
                left = cgroup_headroom("/sys/fs/cgroup", path, "memory.max", "memory.current");
                uint64_t hybrid = cgroup_headroom("/sys/fs/cgroup/unified", path, "memory.max",
                                                  "memory.current");
                left = hybrid < left ? hybrid : left;
            } else if (strstr(controllers, "memory")) {
                char list[256];
                nvshare_copy_str(list, sizeof list, controllers);
                for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                    if (strcmp(tok, "memory") == 0)
                        left = cgroup_headroom("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                                               "memory.usage_in_bytes");
            }
            if (left < room) {
                room = left;
                *what = "the job's memory limit (cgroup)";
            }
        }
        fclose(f);
    }
    f = fopen("/proc/meminfo", "re");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                if (kb * 1024ull < room) {
                    room = kb * 1024ull;
                    *what = "the node's available memory";
                }
                break;
            }
        fclose(f);
    }
    return room;
}

/* ---- moving memory --------------------------------------------------------------------------- */
static int push_gpu_context(struct nvshare_gpu *g)
{
    CUcontext ctx = nvshare_ctx_for_gpu(g);
    return ctx && nvshare_real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS ? 0 : -1;
}

static void pop_context(void)
{
    CUcontext popped;
    nvshare_real.cuCtxPopCurrent_v2(&popped);
}

/* ---- host copies pinned ahead (NVSHARE_SWAP_PREPIN) ------------------------------------------------
 * A first swap-out allocates and pins its host copies as it goes, and that is what limits it: 3.4-5.5
 * GB/s on the H100 with hostpin.c's huge pages (2.2 GB/s with cuMemHostAlloc), against 50-55 GB/s into
 * copies pinned before. Slurm 22.05 freezes a suspended job 2 s after its SIGTSTP, so a job that has
 * never swapped gets 7-11 GiB out before the freeze. With NVSHARE_SWAP_PREPIN=1 a thread pins the
 * host copies of the resident chunks while the job runs (with =ahead, from the first grant that says
 * SWAP_AHEAD), one chunk at a time, within its host memory (the same headroom a swap-out needs, and
 * PINNED_KEEP_HEADROOM_BYTES beyond it), so that a suspension or a switch moves them at bus speed.
 * They cost that much of the job's --mem. */
#define PREPIN_IDLE_MS 1000     /* nothing to pin: look again after this */
#define PREPIN_SHORT_MS 5000    /* no host memory to spare: look again after this */

/* With swap_mu held: the newest chunk resident here without a host copy (a swap-out moves the
 * newest first) among the newest prepin_target bytes, or NULL. */
static struct nvshare_swap_entry *unpinned_chunk(struct nvshare_gpu *g)
{
    uint64_t target = atomic_load(&g->swap.prepin_target), newer = 0;
    for (size_t i = g->swap.count; i-- > 0 && newer < target;) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (!e->resident || e->fixed)
            continue;
        if (!e->host)
            return e;
        newer += e->size;
    }
    return NULL;
}

static void *prepin_main(void *arg)
{
    struct nvshare_gpu *g = arg;
    nvshare_in_hook = 1;   /* driver calls of this thread are the hook's own */
    int warned = 0;
    uint64_t pinned = 0;
    for (;;) {
        pthread_mutex_lock(&g->swap.mu);
        struct nvshare_swap_entry *e = unpinned_chunk(g);
        CUdeviceptr va = e ? e->va : 0;
        size_t size = e ? e->size : 0;
        pthread_mutex_unlock(&g->swap.mu);
        if (!e) {
            if (pinned)
                nvshare_debug("gpu %s: %.1f MiB of host copies pinned ahead", g->uuid, pinned / 1048576.0);
            pinned = 0;
            usleep(PREPIN_IDLE_MS * 1000);
            continue;
        }
        const char *what;
        if (host_headroom(&what) < size + HOST_MARGIN_BYTES + PINNED_KEEP_HEADROOM_BYTES) {
            if (!warned++)
                nvshare_log("gpu %s: host copies not pinned ahead (NVSHARE_SWAP_PREPIN): %s leaves too "
                            "little host memory", g->uuid, what);
            usleep(PREPIN_SHORT_MS * 1000);
            continue;
        }
        void *host = NULL;
        int mapped = 0;
        CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
        if (push_gpu_context(g) == 0) {
            rc = nvshare_host_pin(&host, size, &mapped);
            pop_context();
        }
        if (rc != CUDA_SUCCESS) {
            /* prepin_running stays set: stopped for good, not restarted at the next allocation. */
            nvshare_log("gpu %s: cannot pin host memory ahead (NVSHARE_SWAP_PREPIN, CUDA error %d); stopped",
                        g->uuid, rc);
            return NULL;
        }
        /* Pinned outside swap_mu (it takes ~150 ms a chunk): the chunk may have gone meanwhile. */
        pthread_mutex_lock(&g->swap.mu);
        struct nvshare_swap_entry *now = NULL;
        for (size_t i = 0; i < g->swap.count && !now; i++)
            if (g->swap.entries[i].va == va && g->swap.entries[i].size == size)
                now = &g->swap.entries[i];
        if (now && !now->host) {
            now->host = host;
            now->host_mapped = mapped;
            host = NULL;
            pinned += size;
        }
        pthread_mutex_unlock(&g->swap.mu);
        nvshare_host_unpin(host, size, mapped);
    }
    return NULL;
}

/* Starts the pinning thread once (any thread, with or without swap_mu). */
static void start_prepin(struct nvshare_gpu *g)
{
    if (__atomic_exchange_n(&g->swap.prepin_running, 1, __ATOMIC_ACQ_REL))
        return;
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (pthread_create(&tid, &attr, prepin_main, g) != 0)
        __atomic_store_n(&g->swap.prepin_running, 0, __ATOMIC_RELEASE);
    pthread_attr_destroy(&attr);
}

static void pin_ahead(struct nvshare_gpu *g, uint64_t bytes)
{
    if (nvshare_cfg.swap_prepin != NVSHARE_PREPIN_AHEAD)
        return;
    /* The daemon says what of this job's memory the GPU lacks room for: what its turn's end will
     * move out, newest chunks first. Pinning all of it (two 45 GiB jobs: 90 GiB of host memory)
     * made the first job's exit slow the other's last swap-in from 0.3 s to 4 s on the H100. 0: an
     * older daemon that does not say; all of it then. */
    uint64_t want = bytes ? bytes : UINT64_MAX;
    if (atomic_exchange(&g->swap.prepin_target, want) != want) {
        if (bytes)
            nvshare_debug("gpu %s: turns with swap: the newest %.1f MiB of host copies pinned ahead "
                          "(NVSHARE_SWAP_PREPIN=ahead)", g->uuid, bytes / 1048576.0);
        else
            nvshare_debug("gpu %s: turns with swap: all host copies pinned ahead (NVSHARE_SWAP_PREPIN=ahead)",
                          g->uuid);
    }
    start_prepin(g);
}

void nvshare_swap_on_grant(struct nvshare_gpu *g, int stop_out, int ahead, uint64_t bytes)
{
    if (stop_out)
        nvshare_swap_set_abort(g, 1);
    if (ahead)
        pin_ahead(g, bytes);
}

uint64_t nvshare_swap_out(struct nvshare_gpu *g, uint64_t bytes, void (*progress)(struct nvshare_gpu *))
{
    const struct nvshare_real *r = &nvshare_real;
    if (!bytes || !g->swap.count)
        return 0;
    if (atomic_load(&g->swap.peer_access)) {
        /* Another GPU of this process may reach this memory from its kernels, past this GPU's gate:
         * it stays where it is (reported fixed). */
        g->swap.blocked = 1;
        return 0;
    }
    /* Newest first: what moves is decided by the bytes the next job needs, not by use. */
    uint64_t plan = 0, to_pin = 0;
    for (size_t i = g->swap.count; i-- > 0 && plan < bytes;) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (!e->resident || e->fixed)
            continue;
        plan += e->size;
        if (!e->host && !untouched(g, e))
            to_pin += e->size;
    }
    if (!plan)
        return 0;
    if (to_pin) {
        const char *what;
        uint64_t room = host_headroom(&what);
        if (room < to_pin + HOST_MARGIN_BYTES) {
            nvshare_log("gpu %s: swap needs %.2f GiB more host memory but %s leaves only %.2f GiB; its "
                        "memory stays on the GPU (ask Slurm for more memory with --mem, or set "
                        "NVSHARE_SWAP=off)", g->uuid, to_pin / 1073741824.0, what, room / 1073741824.0);
            g->swap.blocked = 1;
            return 0;
        }
    }
    nvshare_in_hook++;
    if (push_gpu_context(g) != 0) {
        nvshare_in_hook--;
        nvshare_log("gpu %s: no context to copy its memory with; nothing swapped", g->uuid);
        return 0;
    }
    uint64_t started = nvshare_now_ns(), moved = 0;
    unsigned pinned_now = 0;
    for (size_t i = g->swap.count; i-- > 0 && moved < bytes;) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (!e->resident || e->fixed)
            continue;
        if (atomic_load(&g->swap.abort)) {
            nvshare_debug("gpu %s: swap-out stopped after %.1f MiB: granted meanwhile, or its job runs again "
                          "after a suspend", g->uuid, moved / 1048576.0);
            break;
        }
        /* Brought back by a prefetch and never written: its contents are nobody's, nothing to copy
         * (a waiter's deferred allocation, asked back out by the holder's growth: without this,
         * host memory pinned for it at 2.4 GB/s while the holder's allocation waited). */
        int copy = !untouched(g, e);
        if (copy && !e->host && (pinned_now++, nvshare_host_pin(&e->host, e->size, &e->host_mapped)) != CUDA_SUCCESS) {
            e->host = NULL;
            nvshare_log("gpu %s: cannot pin %zu bytes of host memory for swap; the rest stays on the GPU",
                        g->uuid, e->size);
            g->swap.blocked = 1;
            break;
        }
        CUresult rc = copy ? r->cuMemcpyDtoH_v2(e->host, e->va, e->size) : CUDA_SUCCESS;
        if (rc != CUDA_SUCCESS) {
            nvshare_log("gpu %s: copying %zu bytes to host memory failed (CUDA error %d); they stay on the GPU",
                        g->uuid, e->size, rc);
            g->swap.blocked = 1;
            break;
        }
        if (unmap_chunk(g, e) != CUDA_SUCCESS) {
            /* That chunk stays where it is, from now on reported fixed; the next one may still go
             * (stopping here left the next job waiting for room that was never made). */
            e->fixed = 1;
            counted(g, -(int64_t)e->size, 0);
            continue;
        }
        e->has_data = copy;
        e->clean = 0;
        moved += e->size;
        counted(g, -(int64_t)e->size, (int64_t)e->size);
        if (progress && moved < bytes)
            progress(g);
    }
    pop_context();
    nvshare_in_hook--;
    double ms = (nvshare_now_ns() - started) / 1e6;
    nvshare_debug("gpu %s: swapped out %.1f MiB in %.1f ms (%.1f GB/s, %u chunks pinned first)", g->uuid,
                  moved / 1048576.0, ms, ms > 0 ? moved / ms / 1e6 : 0.0, pinned_now);
    return moved;
}

static uint64_t host_headroom(const char **what);

/* After a swap-in: drops the pinned copies when the job's host memory runs short. */
static void free_pinned_if_short(struct nvshare_gpu *g)
{
    const char *what;
    uint64_t room = host_headroom(&what);
    if (room >= PINNED_KEEP_HEADROOM_BYTES)
        return;
    uint64_t freed = 0;
    for (size_t i = 0; i < g->swap.count; i++) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (e->resident && e->host) {
            nvshare_host_unpin(e->host, e->size, e->host_mapped);
            freed += e->size;
            e->host = NULL;
            e->has_data = 0;
        }
    }
    if (freed)
        nvshare_debug("gpu %s: freed %.1f MiB of pinned swap copies: %s leaves %.2f GiB", g->uuid,
                      freed / 1048576.0, what, room / 1073741824.0);
}

/* Brings swapped chunks back, at most `limit` bytes of them (whole chunks); *moved = what came
 * back. A prefetch leaves the gate and the pinned copies alone and logs at debug level only. */
static int swap_in_upto(struct nvshare_gpu *g, uint64_t limit, uint64_t *moved_out, int prefetch)
{
    const struct nvshare_real *r = &nvshare_real;
    *moved_out = 0;
    int missing = 0;
    for (size_t i = 0; i < g->swap.count; i++)
        missing += !g->swap.entries[i].resident;
    if (!missing)
        return 0;
    nvshare_in_hook++;
    if (push_gpu_context(g) != 0) {
        nvshare_in_hook--;
        nvshare_log("gpu %s: no context to bring its memory back with", g->uuid);
        return -1;
    }
    uint64_t started = nvshare_now_ns(), moved = 0;
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < g->swap.count && rc == CUDA_SUCCESS; i++) {
        struct nvshare_swap_entry *e = &g->swap.entries[i];
        if (e->resident || e->size > limit - moved)
            continue;
        rc = map_physical(g, e);
        if (rc != CUDA_SUCCESS)
            break;
        /* Born swapped (or moved out untouched): nothing to copy; a prefetch's stays untouched
         * until the gate next opens. */
        e->clean = !e->has_data && prefetch ? atomic_load(&g->gate.opens) + 1 : 0;
        if (e->has_data) {
            rc = r->cuMemcpyHtoD_v2(e->va, e->host, e->size);
            if (rc != CUDA_SUCCESS) {
                unmap_chunk(g, e);
                break;
            }
        }
        moved += e->size;
        counted(g, (int64_t)e->size, -(int64_t)e->size);
    }
    /* What the driver had free when it refused: the daemon's count and the driver's can differ
     * for a while (an ended process's memory is freed some time after it ended). */
    size_t driver_free = 0, driver_total = 0;
    int free_known = rc == CUDA_ERROR_OUT_OF_MEMORY && r->cuMemGetInfo_v2 &&
                     r->cuMemGetInfo_v2(&driver_free, &driver_total) == CUDA_SUCCESS;
    pop_context();
    nvshare_in_hook--;
    *moved_out = moved;
    double ms = (nvshare_now_ns() - started) / 1e6;
    if (prefetch) {
        nvshare_debug("gpu %s: brought %.1f MiB back ahead of its turn in %.1f ms%s", g->uuid,
                      moved / 1048576.0, ms, rc == CUDA_SUCCESS ? "" : " (then the GPU had no room)");
        return rc == CUDA_SUCCESS ? 0 : -1;
    }
    if (rc == CUDA_SUCCESS) {
        g->swap.blocked = 0;
        free_pinned_if_short(g);
        nvshare_debug("gpu %s: swapped in %.1f MiB in %.1f ms (%.1f GB/s)", g->uuid, moved / 1048576.0, ms,
                      ms > 0 ? moved / ms / 1e6 : 0.0);
        return 0;
    }
    /* No deadline here: gate.c gives the lock back (NO_ROOM) and asks again after a pause, for as
     * long as it takes; the app's work waits at the gate and sees no error. */
    char why[96] = "";
    if (free_known)
        snprintf(why, sizeof why, ": GPU full, the driver has %.1f MiB free", driver_free / 1048576.0);
    else if (rc == CUDA_ERROR_OUT_OF_MEMORY)
        snprintf(why, sizeof why, ": GPU full");
    nvshare_log("gpu %s: bringing its memory back stopped after %.1f MiB (CUDA error %d%s); it waits "
                "for room", g->uuid, moved / 1048576.0, rc, why);
    return -1;
}

int nvshare_swap_in(struct nvshare_gpu *g)
{
    uint64_t moved;
    return swap_in_upto(g, UINT64_MAX, &moved, 0);
}

int nvshare_swap_prefetch(struct nvshare_gpu *g, uint64_t limit, uint64_t *moved)
{
    return swap_in_upto(g, limit, moved, 1);
}

/* The child's GPU memory is not the parent's: forget the parent's without touching the driver. */
void nvshare_swap_after_fork(void)
{
    int n = atomic_load(&nvshare_n_gpus);
    for (int i = 0; i < n; i++) {
        struct nvshare_gpu *g = &nvshare_gpus[i];
        pthread_mutex_init(&g->swap.mu, NULL);
        free(g->swap.entries);
        g->swap.entries = NULL;
        g->swap.count = g->swap.cap = 0;
        g->swap.blocked = 0;
        g->swap.prepin_running = 0;   /* the parent's thread is not the child's */
        atomic_store(&g->swap.prepin_target, 0);
    }
}
