/* ipc.c: CUDA IPC handles for memory that swap.c backs.
 *
 * The driver refuses cuIpcGetMemHandle on virtual-memory (VMM) allocations, and cudaMalloc under the
 * hook is one. PyTorch's CUDA tensor sharing and vLLM's custom all-reduce depend on it, so the hook
 * exports such an allocation itself:
 *  - exporter: its chunks are fixed on the GPU for good (another process maps them; swap.c never
 *    moves them again) and exported as file descriptors (chunks are made with that handle type). The
 *    64-byte handle becomes an nvshare record: magic, exporter pid, a random token, export id, layout.
 *    A thread started at the first export serves the fds over an abstract unix socket named from pid
 *    and token, by SCM_RIGHTS, to processes of the same uid (SO_PEERCRED) that present the token.
 *    The token is no secret from other users (/proc/net/unix lists the socket's name): the uid
 *    checks, the server's and the importer's of the server, are what keep users apart.
 *  - importer: cuIpcOpenMemHandle on such a record fetches the fds, imports and maps them under a new
 *    reservation, and returns its start: the allocation's base, as the driver does for cuMemAlloc
 *    memory (checked on the H100: a handle taken from an interior pointer opens at the base).
 * Handles that are not nvshare's go to the driver unchanged, both ways.
 *
 * Layering: hook_memory.c's cuIpc* wrappers call in here; this file calls swap.c and the driver,
 * nothing above.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"
#include "env.h"
#include "gpus.h"
#include "ipc.h"
#include "swap.h"

#define IPC_MAGIC 0x3143504948535654ull   /* "TVSHIPC1" little-endian: not what a driver handle starts with */
#define IPC_FDS_PER_MESSAGE 250           /* under the kernel's SCM_MAX_FD (253) */
#define IPC_IO_TIMEOUT_MS 5000            /* a peer that stops talking is dropped, never waited on forever */
#define IPC_MAX_CHUNKS (1u << 20)
#define IPC_REFUSAL_LOG_NS (60ull * 1000000000ull)

/* The 64 bytes of a CUipcMemHandle, nvshare's kind. */
struct ipc_record {
    uint64_t magic;
    uint32_t pid;          /* the exporter: its socket is named from pid and token */
    uint32_t export_id;
    uint64_t token;        /* this run of the exporter: a recycled pid is not mistaken for it */
    uint64_t size;
    uint64_t chunk_bytes;
    uint32_t n_chunks;
    uint32_t reserved;
    uint64_t check;        /* a torn or forged-by-accident record is refused before any I/O */
    uint64_t spare;
};
_Static_assert(sizeof(struct ipc_record) == sizeof(CUipcMemHandle), "an IPC record fills a CUipcMemHandle");

struct ipc_request {
    uint64_t magic;
    uint64_t token;
    uint32_t export_id;
    uint32_t spare;
};
struct ipc_reply {
    uint64_t magic;
    int32_t status;        /* 0, or the CUresult the importer returns */
    uint32_t n_fds;        /* then ceil(n_fds / IPC_FDS_PER_MESSAGE) messages carry them */
};

struct ipc_export {
    uint32_t id;           /* 0 = free slot */
    CUdeviceptr base;
    size_t size, chunk_bytes, n;
    int *fds;
};
struct ipc_import {
    uint32_t pid, export_id;
    uint64_t token;
    int refs;              /* 0 = free slot */
    CUdeviceptr va;
    size_t size, chunk_bytes, n;
    CUmemGenericAllocationHandle *handles;
};

static pthread_mutex_t ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ipc_export *exports;
static size_t n_exports;
static uint32_t next_export_id = 1;
static struct ipc_import *imports;
static size_t n_imports;
static uint64_t my_token;
static int server_fd = -1;
static uint64_t refusal_logged_ns;      /* the server thread's alone */
static unsigned long refusals_unlogged;

static uint64_t record_check(const struct ipc_record *r)
{
    uint64_t h = r->magic ^ ((uint64_t)r->pid << 32 | r->export_id);
    h = (h ^ r->token) * 0x9e3779b97f4a7c15ull;
    h = (h ^ r->size) * 0xff51afd7ed558ccdull;
    h = (h ^ r->chunk_bytes ^ r->n_chunks) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

static socklen_t socket_name(struct sockaddr_un *addr, uint32_t pid, uint64_t token)
{
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    /* Abstract (leading NUL): nothing on disk to clean up, gone with the process. */
    int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "nvshare-ipc-%" PRIu32 "-%016" PRIx64,
                     pid, token);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void set_timeouts(int fd)
{
    struct timeval tv = {IPC_IO_TIMEOUT_MS / 1000, (IPC_IO_TIMEOUT_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* ---- the exporter's server -------------------------------------------------------------------- */
static int send_with_fds(int sock, const void *data, size_t len, const int *fds, size_t n)
{
    char control[CMSG_SPACE(sizeof(int) * IPC_FDS_PER_MESSAGE)];
    struct iovec iov = {(void *)data, len};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (n) {
        memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    }
    return sendmsg(sock, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Any user can connect (the name is listed in /proc/net/unix): a line for each refusal would let
 * them fill the job's output. One line, then at most one per interval with the count since. */
static void log_refusal(const struct ucred *peer)
{
    uint64_t now = nvshare_now_ns();
    if (refusal_logged_ns && now - refusal_logged_ns < IPC_REFUSAL_LOG_NS) {
        refusals_unlogged++;
        return;
    }
    nvshare_log("CUDA IPC: refused a request from pid %d uid %d: only this job's user may map its memory "
                "(%lu more refused since the last such line)", (int)peer->pid, (int)peer->uid,
                refusals_unlogged);
    refusal_logged_ns = now;
    refusals_unlogged = 0;
}

static void serve_one(int conn)
{
    struct ucred peer = {0};
    socklen_t len = sizeof peer;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != geteuid()) {
        log_refusal(&peer);
        return;
    }
    set_timeouts(conn);
    struct ipc_request req;
    if (recv(conn, &req, sizeof req, 0) != (ssize_t)sizeof req)
        return;
    struct ipc_reply reply = {IPC_MAGIC, CUDA_ERROR_INVALID_HANDLE, 0};
    int *fds = NULL;
    size_t n = 0;
    pthread_mutex_lock(&ipc_mu);
    if (req.magic == IPC_MAGIC && req.token == my_token)
        for (size_t i = 0; i < n_exports; i++)
            if (exports[i].id && exports[i].id == req.export_id) {
                /* Duplicates, so that a free meanwhile cannot close what is being sent. */
                fds = malloc(exports[i].n * sizeof *fds);
                for (size_t k = 0; fds && k < exports[i].n; k++) {
                    fds[k] = fcntl(exports[i].fds[k], F_DUPFD_CLOEXEC, 0);
                    if (fds[k] < 0) {
                        while (k)
                            close(fds[--k]);
                        free(fds);
                        fds = NULL;
                        break;
                    }
                }
                if (fds) {
                    n = exports[i].n;
                    reply.status = CUDA_SUCCESS;
                    reply.n_fds = (uint32_t)n;
                } else {
                    reply.status = CUDA_ERROR_OUT_OF_MEMORY;
                }
                break;
            }
    pthread_mutex_unlock(&ipc_mu);
    if (reply.status != CUDA_SUCCESS)
        nvshare_debug("CUDA IPC: pid %d asked for export %" PRIu32 ", which this process does not have (CUDA error %d)",
                      (int)peer.pid, req.export_id, reply.status);
    if (send_with_fds(conn, &reply, sizeof reply, NULL, 0) == 0)
        for (size_t sent = 0; sent < n;) {
            uint32_t batch = (uint32_t)(n - sent < IPC_FDS_PER_MESSAGE ? n - sent : IPC_FDS_PER_MESSAGE);
            if (send_with_fds(conn, &batch, sizeof batch, fds + sent, batch) != 0)
                break;
            sent += batch;
        }
    for (size_t k = 0; k < n; k++)
        close(fds[k]);
    free(fds);
}

static void *server_main(void *arg)
{
    int listener = (int)(intptr_t)arg;
    for (;;) {
        int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            nvshare_log("CUDA IPC: the handle server stopped (%s); handles exported so far cannot be opened",
                        strerror(errno));
            return NULL;
        }
        serve_one(conn);
        close(conn);
    }
}

/* With ipc_mu held: the server is listening (started once per process). */
static CUresult ensure_server(void)
{
    if (server_fd >= 0)
        return CUDA_SUCCESS;
    /* The system call, not glibc's getrandom (2.25): the library loads on glibc 2.17 (setup.py). */
    while (!my_token && syscall(SYS_getrandom, &my_token, sizeof my_token, 0) != (long)sizeof my_token) {
        if (errno != EINTR) {
            nvshare_log("CUDA IPC: no random token (%s)", strerror(errno));
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    socklen_t len = socket_name(&addr, (uint32_t)getpid(), my_token);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, len) != 0 || listen(fd, 64) != 0) {
        nvshare_log("CUDA IPC: cannot listen for importers (%s)", strerror(errno));
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&thread, &attr, server_main, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
    if (err) {
        close(fd);
        nvshare_log("CUDA IPC: cannot start the handle server (%s)", strerror(err));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    server_fd = fd;
    return CUDA_SUCCESS;
}

static void fill_record(CUipcMemHandle *handle, const struct ipc_export *x)
{
    struct ipc_record r = {IPC_MAGIC, (uint32_t)getpid(), x->id, my_token, x->size, x->chunk_bytes,
                           (uint32_t)x->n, 0, 0, 0};
    r.check = record_check(&r);
    memcpy(handle, &r, sizeof r);
}

CUresult nvshare_ipc_export(struct nvshare_gpu *g, CUdeviceptr ptr, CUipcMemHandle *handle,
                            uint64_t *newly_fixed)
{
    *newly_fixed = 0;
    CUdeviceptr base;
    size_t size;
    if (!nvshare_swap_range(ptr, &base, &size))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&ipc_mu);
    CUresult rc = ensure_server();
    for (size_t i = 0; rc == CUDA_SUCCESS && i < n_exports; i++)
        if (exports[i].id && exports[i].base == base) {  /* exported before: the same record again */
            fill_record(handle, &exports[i]);
            pthread_mutex_unlock(&ipc_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&ipc_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct nvshare_swap_export out;
    rc = nvshare_swap_export(g, ptr, &out);
    if (rc != CUDA_SUCCESS)
        return rc;
    *newly_fixed = out.newly_fixed;
    pthread_mutex_lock(&ipc_mu);
    struct ipc_export *slot = NULL;
    for (size_t i = 0; i < n_exports && !slot; i++)
        if (!exports[i].id)
            slot = &exports[i];
    if (!slot) {
        struct ipc_export *grown = realloc(exports, (n_exports + 1) * sizeof *grown);
        if (grown) {
            exports = grown;
            slot = &exports[n_exports++];
        }
    }
    if (!slot) {
        pthread_mutex_unlock(&ipc_mu);
        for (size_t k = 0; k < out.n; k++)
            close(out.fds[k]);
        free(out.fds);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *slot = (struct ipc_export){next_export_id++, out.base, out.size, out.chunk_bytes, out.n, out.fds};
    fill_record(handle, slot);
    pthread_mutex_unlock(&ipc_mu);
    nvshare_debug("gpu %s: CUDA IPC: %zu bytes at 0x%llx exported in %zu chunks; fixed on the GPU from now on",
                  g->uuid, out.size, (unsigned long long)out.base, out.n);
    return CUDA_SUCCESS;
}

void nvshare_ipc_forget(CUdeviceptr base)
{
    pthread_mutex_lock(&ipc_mu);
    for (size_t i = 0; i < n_exports; i++)
        if (exports[i].id && exports[i].base == base) {
            for (size_t k = 0; k < exports[i].n; k++)
                close(exports[i].fds[k]);
            free(exports[i].fds);
            exports[i] = (struct ipc_export){0};
        }
    pthread_mutex_unlock(&ipc_mu);
}

/* ---- the importer ----------------------------------------------------------------------------- */
int nvshare_ipc_is_ours(const CUipcMemHandle *handle)
{
    struct ipc_record r;
    memcpy(&r, handle, sizeof r);
    return r.magic == IPC_MAGIC;
}

/* Receives n fds in batches; 0 when all came. On failure every fd received is closed again: one
 * kept would hold the exporter's GPU memory until this process exits. */
static int receive_fds(int sock, int *fds, size_t n)
{
    size_t got = 0;
    while (got < n) {
        uint32_t batch = 0;
        char control[CMSG_SPACE(sizeof(int) * IPC_FDS_PER_MESSAGE)];
        struct iovec iov = {&batch, sizeof batch};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t len = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        int carried[IPC_FDS_PER_MESSAGE];
        size_t n_carried = 0;
        for (struct cmsghdr *c = len >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            if (k > IPC_FDS_PER_MESSAGE - n_carried)
                k = IPC_FDS_PER_MESSAGE - n_carried;  /* cannot happen: the buffer holds no more */
            memcpy(carried + n_carried, CMSG_DATA(c), k * sizeof(int));
            n_carried += k;
        }
        if (len != (ssize_t)sizeof batch || n_carried == 0 || n_carried != batch || n_carried > n - got) {
            for (size_t k = 0; k < n_carried; k++)
                close(carried[k]);
            while (got)
                close(fds[--got]);
            return -1;
        }
        memcpy(fds + got, carried, n_carried * sizeof(int));
        got += n_carried;
    }
    return 0;
}

/* The fds of the exporter's allocation: CUDA_SUCCESS, or the error the importer returns. */
static CUresult fetch(const struct ipc_record *r, int *fds)
{
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    set_timeouts(sock);
    struct sockaddr_un addr;
    socklen_t len = socket_name(&addr, r->pid, r->token);
    if (connect(sock, (struct sockaddr *)&addr, len) != 0) {
        nvshare_debug("CUDA IPC: exporter pid %" PRIu32 " does not answer (%s): gone, or not in this job",
                      r->pid, strerror(errno));
        close(sock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /* The name is no secret (/proc/net/unix lists it) and is free again once the exporter is gone:
     * memory only from this user, as the exporter gives it only to this user. */
    struct ucred peer = {0};
    socklen_t peer_len = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer.uid != geteuid()) {
        nvshare_log("CUDA IPC: the socket of exporter pid %" PRIu32 " is held by pid %d uid %d, not this "
                    "job's user: the handle is not opened", r->pid, (int)peer.pid, (int)peer.uid);
        close(sock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct ipc_request req = {IPC_MAGIC, r->token, r->export_id, 0};
    struct ipc_reply reply = {0};
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    if (send(sock, &req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req &&
        recv(sock, &reply, sizeof reply, 0) == (ssize_t)sizeof reply && reply.magic == IPC_MAGIC) {
        if (reply.status != CUDA_SUCCESS)
            rc = reply.status;
        else if (reply.n_fds != r->n_chunks)
            rc = CUDA_ERROR_INVALID_HANDLE;
        else
            rc = receive_fds(sock, fds, r->n_chunks) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    }
    close(sock);
    return rc;
}

/* Unmaps and releases the first `mapped` chunks of an import (and frees its reservation). */
static void unmap_import(CUdeviceptr va, size_t size, size_t chunk_bytes, CUmemGenericAllocationHandle *handles,
                         size_t imported, size_t mapped)
{
    const struct nvshare_real *r = &nvshare_real;
    for (size_t i = 0; i < mapped; i++) {
        size_t off = i * chunk_bytes;
        CUresult rc = r->cuMemUnmap(va + off, size - off < chunk_bytes ? size - off : chunk_bytes);
        if (rc != CUDA_SUCCESS)
            nvshare_log("CUDA IPC: unmapping imported memory at 0x%llx failed (CUDA error %d)",
                        (unsigned long long)(va + off), rc);
    }
    for (size_t i = 0; i < imported; i++)
        r->cuMemRelease(handles[i]);
    r->cuMemAddressFree(va, size);
}

CUresult nvshare_ipc_open(CUdeviceptr *dptr, const CUipcMemHandle *handle, unsigned int flags)
{
    const struct nvshare_real *r = &nvshare_real;
    struct ipc_record rec;
    memcpy(&rec, handle, sizeof rec);
    if (!dptr || rec.check != record_check(&rec) || !rec.size || !rec.chunk_bytes || !rec.n_chunks ||
        rec.n_chunks > IPC_MAX_CHUNKS || (rec.size + rec.chunk_bytes - 1) / rec.chunk_bytes != rec.n_chunks)
        return CUDA_ERROR_INVALID_VALUE;
    if (rec.pid == (uint32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT;  /* as the driver: a process does not open its own handle */
    if (!r->cuMemImportFromShareableHandle || !r->cuMemAddressReserve || !r->cuMemMap || !r->cuMemSetAccess ||
        !r->cuCtxGetDevice)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&ipc_mu);
    for (size_t i = 0; i < n_imports; i++)
        if (imports[i].refs && imports[i].pid == rec.pid && imports[i].token == rec.token &&
            imports[i].export_id == rec.export_id) {
            imports[i].refs++;
            *dptr = imports[i].va;
            pthread_mutex_unlock(&ipc_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&ipc_mu);

    CUdevice dev;
    CUresult rc = r->cuCtxGetDevice(&dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    int *fds = calloc(rec.n_chunks, sizeof *fds);
    CUmemGenericAllocationHandle *handles = calloc(rec.n_chunks, sizeof *handles);
    if (!fds || !handles) {
        free(fds);
        free(handles);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc = fetch(&rec, fds);
    if (rc != CUDA_SUCCESS) {
        free(fds);
        free(handles);
        return rc;
    }
    nvshare_in_hook++;
    CUdeviceptr va = 0;
    size_t imported = 0, mapped = 0;
    rc = r->cuMemAddressReserve(&va, rec.size, 0, 0, 0);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < rec.n_chunks; i++) {
        rc = r->cuMemImportFromShareableHandle(&handles[i], (void *)(uintptr_t)fds[i],
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (rc != CUDA_SUCCESS)
            break;
        imported++;
        size_t off = i * rec.chunk_bytes;
        rc = r->cuMemMap(va + off, rec.size - off < rec.chunk_bytes ? rec.size - off : rec.chunk_bytes, 0,
                         handles[i], 0);
        if (rc == CUDA_SUCCESS)
            mapped++;
    }
    if (rc == CUDA_SUCCESS) {
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        rc = r->cuMemSetAccess(va, rec.size, &access, 1);
    }
    if (rc != CUDA_SUCCESS && va)
        unmap_import(va, rec.size, rec.chunk_bytes, handles, imported, mapped);
    nvshare_in_hook--;
    for (size_t i = 0; i < rec.n_chunks; i++)
        close(fds[i]);  /* the imported handles hold the memory now */
    free(fds);
    if (rc != CUDA_SUCCESS) {
        free(handles);
        nvshare_log("CUDA IPC: mapping %" PRIu64 " bytes from pid %" PRIu32 " failed (CUDA error %d)",
                    rec.size, rec.pid, rc);
        return rc;
    }
    pthread_mutex_lock(&ipc_mu);
    struct ipc_import *slot = NULL;
    for (size_t i = 0; i < n_imports && !slot; i++)
        if (!imports[i].refs)
            slot = &imports[i];
    if (!slot) {
        struct ipc_import *grown = realloc(imports, (n_imports + 1) * sizeof *grown);
        if (grown) {
            imports = grown;
            slot = &imports[n_imports++];
        }
    }
    if (slot)
        *slot = (struct ipc_import){rec.pid, rec.export_id, rec.token, 1, va, rec.size, rec.chunk_bytes,
                                    rec.n_chunks, handles};
    pthread_mutex_unlock(&ipc_mu);
    if (!slot) {
        nvshare_in_hook++;
        unmap_import(va, rec.size, rec.chunk_bytes, handles, rec.n_chunks, rec.n_chunks);
        nvshare_in_hook--;
        free(handles);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (void)flags;  /* peer access: the mapping is made for the current device itself */
    *dptr = va;
    return CUDA_SUCCESS;
}

int nvshare_ipc_close(CUdeviceptr dptr, CUresult *rc)
{
    pthread_mutex_lock(&ipc_mu);
    struct ipc_import *found = NULL;
    for (size_t i = 0; i < n_imports && !found; i++)
        if (imports[i].refs && imports[i].va == dptr)
            found = &imports[i];
    if (!found) {
        pthread_mutex_unlock(&ipc_mu);
        return 0;
    }
    struct ipc_import gone = *found;
    if (--found->refs == 0)
        *found = (struct ipc_import){0};
    pthread_mutex_unlock(&ipc_mu);
    *rc = CUDA_SUCCESS;
    if (gone.refs > 1)
        return 1;
    /* cuIpcCloseMemHandle waits for work that may still use the memory, as the driver's does. */
    nvshare_in_hook++;
    if (nvshare_real.cuCtxSynchronize)
        nvshare_real.cuCtxSynchronize();
    unmap_import(gone.va, gone.size, gone.chunk_bytes, gone.handles, gone.n, gone.n);
    nvshare_in_hook--;
    free(gone.handles);
    return 1;
}

/* The child shares neither the parent's server nor its mappings: it starts with none. */
void nvshare_ipc_after_fork(void)
{
    pthread_mutex_init(&ipc_mu, NULL);
    for (size_t i = 0; i < n_exports; i++)
        if (exports[i].id) {
            for (size_t k = 0; k < exports[i].n; k++)
                close(exports[i].fds[k]);
            free(exports[i].fds);
        }
    free(exports);
    exports = NULL;
    n_exports = 0;
    for (size_t i = 0; i < n_imports; i++)
        free(imports[i].handles);
    free(imports);
    imports = NULL;
    n_imports = 0;
    if (server_fd >= 0)
        close(server_fd);
    server_fd = -1;
    my_token = 0;
    refusal_logged_ns = 0;
    refusals_unlogged = 0;
}
