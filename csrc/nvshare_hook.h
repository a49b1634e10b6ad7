/* nvshare_hook.h: what the parts of libnvshare.so share (hook.c, gate.c, client.c, memory.c, env.c).
 * Nothing here is exported: the library is built with -fvisibility=hidden and a version script.
 */
#ifndef NVSHARE_HOOK_H
#define NVSHARE_HOOK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <string.h>

#include "cuda_subset.h"
#include "hook_symbols.h"
#include "nvshare_proto.h"

#define NVSHARE_EXPORT __attribute__((visibility("default")))
/* Thread-locals without __tls_get_addr on the launch path: the library is loaded at start-up. */
#define NVSHARE_TLS __thread __attribute__((tls_model("initial-exec")))

/* ---- real driver functions (hook.c) --------------------------------------------------------- */
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
typedef CUresult (*cuMemPoolGetAttribute_fn)(CUmemoryPool pool, int attr, void *value);
typedef CUresult (*cuDeviceGetDefaultMemPool_fn)(CUmemoryPool *pool, CUdevice dev);
typedef CUresult (*cuDeviceGetMemPool_fn)(CUmemoryPool *pool, CUdevice dev);
typedef CUresult (*cuDeviceGetGraphMemAttribute_fn)(CUdevice dev, int attr, void *value);
typedef CUresult (*cuCtxFromGreenCtx_fn)(CUcontext *ctx, CUgreenCtx green);
typedef CUresult (*cuDevicePrimaryCtxGetState_fn)(CUdevice dev, unsigned int *flags, int *active);
typedef CUresult (*cuMemExportToShareableHandle_fn)(void *shareable, CUmemGenericAllocationHandle handle,
                                                    int type, unsigned long long flags);
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
};
extern struct nvshare_real nvshare_real;

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

/* ---- settings of this process (env.c) ------------------------------------------------------- */
enum nvshare_loss_policy { NVSHARE_LOSS_WAIT = 0, NVSHARE_LOSS_RUN = 1 };
struct nvshare_settings {
    int active;                  /* in a job with a socket: gate and account; else pure pass-through */
    uint32_t job_id;
    uint32_t step_id;
    char socket_path[108];
    int loss_policy;
    uint64_t mem_limit;          /* NVSHARE_MEM_LIMIT bytes, 0 = none */
    int swap;                    /* NVSHARE_SWAP: back allocations so they can move to host memory */
    int alloc_budget;            /* NVSHARE_ALLOC_BUDGET: small allocations from a budget (memory.c) */
    int managed_all;             /* NVSHARE_MANAGED_GPUS unset: every GPU the daemon grants */
    int n_managed;
    char managed[NVSHARE_MAX_GPUS][NVSHARE_UUID_LEN];
    uint32_t drain_timeout_ms;   /* NVSHARE_DRAIN_TIMEOUT_MS: then DRAIN_STUCK, and keep waiting */
    uint32_t daemon_timeout_ms;  /* NVSHARE_DAEMON_TIMEOUT_MS: an unanswered daemon counts as lost */
    int debug;
    int log_time;                /* NVSHARE_LOG_TIME=1: each line carries its wall-clock time */
};
#define NVSHARE_DRAIN_TIMEOUT_MS_DEFAULT 5000u
#define NVSHARE_DAEMON_TIMEOUT_MS_DEFAULT 10000u
extern struct nvshare_settings nvshare_cfg;
void nvshare_read_settings(void);
int nvshare_parse_size(const char *text, uint64_t *out);
int nvshare_gpu_is_managed(const char *uuid);
uint64_t nvshare_now_ns(void);

/* Logging: "nvshare: job 12 step 0 pid 345: <message>", to stderr, one write per line. */
void nvshare_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void nvshare_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- per-GPU state: the gate's (gate.c), memory's (memory.c) and swap's (swap.c) ------------ */
enum nvshare_gpu_mode { GPU_UNKNOWN = 0, GPU_GATED = 1, GPU_PASS = 2 };
#define NVSHARE_MAX_POOLS 32
struct nvshare_swap_entry;

struct nvshare_gpu {
    char uuid[NVSHARE_UUID_LEN];
    CUdevice device;              /* ordinal in this process */
    /* hot path: atomics only */
    atomic_int open;              /* entries pass straight in: lock held, or pass-through */
    atomic_int closing;           /* a release is draining the gate: new entries wait */
    atomic_int inside;            /* threads between gate_enter and gate_leave */
    atomic_int touched;           /* set by every entry, cleared by the keeper: idleness */
    atomic_int demand_touched;    /* set by every entry, cleared by the demand sampler */
    atomic_int syncing;           /* threads in a synchronising call: waiting for this GPU's work */
    /* What the demand sampler saw, for the keeper (demand.c): since when no work entered or ran (0:
     * busy now, or nothing seen yet), the mean idle stretch, the busy share. */
    _Atomic uint64_t idle_since_ns;
    _Atomic uint64_t gap_mean_ns;
    _Atomic uint64_t burst_mean_ns;
    atomic_uint busy_ppm;
    /* Bursts among co-runners (burst.c): the shared page, armed while co-running (shared grant). */
    _Atomic(struct nvshare_burst_page *) burst_page;
    atomic_int burst_armed;
    atomic_int in_burst;          /* a burst of this process is under way (or waiting to begin) */
    atomic_int burst_owner;       /* ... and owns the page */
    atomic_int burst_waiting;     /* threads waiting for another job's burst to end */
    int burst_timeouts_row;       /* these two: only the thread that began the burst (in_burst) */
    uint64_t burst_ignore_until;
    atomic_int mode;              /* enum nvshare_gpu_mode */
    /* slow path, under mu */
    pthread_mutex_t mu;
    pthread_cond_t waiters_cv;    /* threads waiting for the lock */
    pthread_cond_t keeper_cv;     /* the keeper thread: contended / drop / grant */
    int held;
    int requested;
    uint32_t request_seq;
    int waiters;
    int contended;
    int drop_pending;
    int keeper_running;
    pthread_t keeper;
    pthread_cond_t drain_cv;      /* the drainer thread: a drain was asked for */
    int drainer_running;
    int drain_state;              /* gate.c's DRAIN_*: the keeper asks, the drainer answers */
    CUresult drain_rc;
    atomic_int captures;          /* graph captures open on this GPU: no synchronise meanwhile */
    CUcontext primary;            /* the primary context, as retained through the hook */
    uint64_t idle_threshold_ns;
    uint64_t last_release_ns;
    int last_release_idle;
    uint64_t granted_ns;
    uint64_t swap_out_bytes;      /* move at least this much to host memory at the next release */
    uint64_t swap_now_bytes;      /* PREPARE_SWAP_OUT while not holding: the keeper moves it now */
    int swap_in_pending;          /* granted with memory in host memory: bring it back, then open */
    uint64_t no_room_until;       /* swap-in failed for lack of GPU memory: ask again after this */
    /* Hand-over between exclusive turns (HANDOFF, gate.c): eventfds shared with one other process. */
    int handoff_out_fd;           /* holding: write it once drained (-1: none) */
    int handoff_in_fd;            /* waiting: the holder writes it when the GPU is ours (-1: none) */
    unsigned handoff_gen;         /* bumped with every new handoff_in_fd */
    int handoff_polling;          /* a waiting thread polls (a copy of) handoff_in_fd */
    int handoff_on_drain;         /* this release moves nothing: the drainer writes handoff_out_fd */
    /* memory, under memory.c's mutex */
    uint64_t allocated;           /* every byte this process allocated here: resident + swapped */
    CUmemoryPool pools[NVSHARE_MAX_POOLS];  /* stream-ordered pools on this GPU */
    int n_pools;
    _Atomic uint64_t pool_bytes;  /* their reserved memory (and graph memory), last sampled */
    _Atomic uint64_t small_budget;  /* small allocations admitted without asking (memory.c) */
    /* swap.c's counters, read by memory.c */
    _Atomic uint64_t swappable;   /* resident bytes that can move (swap.c backing) */
    _Atomic uint64_t swapped;     /* bytes not on the GPU now (in host memory, or not yet created) */
    /* swap backing (swap.c), under swap_mu */
    pthread_mutex_t swap_mu;
    struct nvshare_swap_entry *swap_entries;
    size_t swap_count, swap_cap;
    int vmm;                      /* -1 not known yet, 0 unsupported, 1 usable */
    int swap_blocked;             /* host memory could not take a swap: report everything fixed */
    atomic_int peer_access;       /* another GPU's context may reach this one's memory: never swapped */
    int swap_busy;                /* the keeper moves memory now (under mu): a grant must wait for it */
    atomic_int swap_abort;        /* a grant came during a PREPARE_SWAP_OUT swap: stop moving out */
    size_t granularity;
    int fd_export;                /* chunks are made exportable as file descriptors (CUDA IPC) */
    int rdma;                     /* the GPU takes GPUDirect RDMA on VMM memory: ask for it, as cuMemAlloc has it */
    int n_access;
    CUmemAccessDesc access[NVSHARE_MAX_GPUS];
};

/* ---- which GPU: GPU slots and the context table (gpus.c) ---------------------------------- */
extern struct nvshare_gpu nvshare_gpus[NVSHARE_MAX_GPUS];
extern atomic_int nvshare_n_gpus;

struct nvshare_gpu *nvshare_gpu_for_current(void);
struct nvshare_gpu *nvshare_gpu_for_device(CUdevice dev);
struct nvshare_gpu *nvshare_gpu_for_ctx(CUcontext ctx);
struct nvshare_gpu *nvshare_gpu_by_uuid(const char *uuid);
void nvshare_gpu_init_sync(struct nvshare_gpu *g);
void nvshare_ctx_forget(CUcontext ctx);
void nvshare_ctx_remember(CUcontext ctx, CUdevice dev);
/* A context of this process on g (for the hook's own copies), or NULL. */
CUcontext nvshare_ctx_for_gpu(struct nvshare_gpu *g);
/* Synchronises every context of g, without holding the table's lock across a synchronise. */
CUresult nvshare_gpus_sync_contexts(struct nvshare_gpu *g);
void nvshare_gpus_after_fork(void);

/* ---- the gate (gate.c) ------------------------------------------------------------------------ */
void nvshare_gate_wait(struct nvshare_gpu *g);

/* Graph captures this thread has open (gate.c): its calls only record work, so they pass. */
extern NVSHARE_TLS atomic_int nvshare_tl_capturing;
void nvshare_capture_began(struct nvshare_gpu *g, CUstream stream);
void nvshare_capture_ended(CUstream stream);
/* The primary context of dev, retained through the hook; gone after a reset or its last release. */
void nvshare_primary_ctx_retained(CUdevice dev, CUcontext ctx);
CUcontext nvshare_primary_ctx_gone(CUdevice dev);

/* ---- bursts among co-runners (burst.c) ------------------------------------------------------ */
/* One page per GPU, shared by the jobs co-running on it; nothing in it is trusted. */
struct nvshare_burst_page {
    _Atomic uint32_t owner;       /* the token of the job whose burst runs, 0: none */
    _Atomic uint32_t seq;         /* futex word: bumped at every burst's end */
    _Atomic uint32_t waiters;     /* a hint: jobs waiting on seq */
    uint32_t pad;
};
int nvshare_burst_attach(struct nvshare_gpu *g, int fd);
void nvshare_burst_begin(struct nvshare_gpu *g);
void nvshare_burst_end(struct nvshare_gpu *g);
void nvshare_burst_after_fork(void);

/* Entering: announce first, then look; a release sets closing first, then waits for inside == 0.
 * Both sides use sequentially consistent atomics, so one of them always sees the other. */
static inline struct nvshare_gpu *nvshare_gate_enter(struct nvshare_gpu *g)
{
    if (!g)
        return NULL;
    if (atomic_load_explicit(&g->burst_armed, memory_order_relaxed) &&
        !atomic_load_explicit(&g->in_burst, memory_order_relaxed) &&
        !atomic_load_explicit(&nvshare_tl_capturing, memory_order_relaxed))
        nvshare_burst_begin(g);
    for (;;) {
        atomic_fetch_add(&g->inside, 1);
        if (atomic_load(&g->open) && !atomic_load(&g->closing)) {
            if (!atomic_load_explicit(&g->touched, memory_order_relaxed))
                atomic_store_explicit(&g->touched, 1, memory_order_relaxed);
            if (!atomic_load_explicit(&g->demand_touched, memory_order_relaxed))
                atomic_store_explicit(&g->demand_touched, 1, memory_order_relaxed);
            return g;
        }
        if (atomic_load_explicit(&nvshare_tl_capturing, memory_order_relaxed))
            return g;
        atomic_fetch_sub(&g->inside, 1);
        nvshare_gate_wait(g);
    }
}

static inline void nvshare_gate_leave(struct nvshare_gpu *g)
{
    if (g)
        atomic_fetch_sub_explicit(&g->inside, 1, memory_order_release);
}

/* Events from the daemon, turned from frames by client.c's reader thread. */
void nvshare_on_grant(struct nvshare_gpu *g, uint32_t flags, uint32_t switch_ms);
void nvshare_on_contended(struct nvshare_gpu *g, uint64_t bytes);
void nvshare_on_drop(struct nvshare_gpu *g, uint32_t reason, uint64_t bytes);
void nvshare_on_prepare_swap_out(struct nvshare_gpu *g, uint64_t bytes);
/* HANDOFF (NVSHARE_HANDOFF_FROM or _TO) with its eventfd, which the gate then owns. */
void nvshare_on_handoff(struct nvshare_gpu *g, uint32_t role, int fd);
void nvshare_on_request_refused(uint32_t seq, int32_t status, const char *message);
void nvshare_on_connection_change(int connected);
void nvshare_gates_open_all(const char *why);
void nvshare_gate_after_fork(void);

/* ---- the outbox: messages to the daemon and the state of the link (outbox.c) ------------------ */
/* Queue without I/O; never blocks on the daemon. 0 when queued on a live connection. */
int nvshare_outbox_gpu_event(uint16_t type, const char *uuid, uint32_t flags, uint64_t bytes,
                             uint32_t *seq_out);
void nvshare_outbox_mem_update(const struct nvshare_mem_update *m);
int nvshare_outbox_heartbeat(void);
/* DEMAND: what this process asks of a GPU lately (demand.c measures it). */
int nvshare_outbox_demand(const struct nvshare_demand *demand);
/* A question (MEM_UPDATE with a request) and its answer, with the daemon's deadline. */
enum { NVSHARE_ASK_ANSWERED = 0, NVSHARE_ASK_NO_DAEMON = 1 };
int nvshare_outbox_ask(const struct nvshare_mem_update *question, int32_t *status,
                       struct nvshare_mem_reply *reply);
int nvshare_outbox_connected(void);
/* Makes sure a connection is being made (the starter hook.c registers: client.c's). */
void nvshare_outbox_want_link(void);
void nvshare_outbox_set_starter(void (*start)(void));
int nvshare_outbox_refused(void);
int nvshare_outbox_silent(void);
uint32_t nvshare_outbox_idle_release_us(void);
uint32_t nvshare_fill_header(struct nvshare_hdr *hdr, uint16_t type, uint32_t length);
/* For client.c only: the link's state, answers, and the frames to write. */
void nvshare_outbox_set_idle_release_us(uint32_t us);
void nvshare_outbox_set_refused(void);
void nvshare_outbox_link(int fd);
void nvshare_outbox_answer(uint32_t seq, int32_t status, const struct nvshare_mem_reply *reply);
int nvshare_outbox_is_question(uint32_t seq);
int nvshare_outbox_take(void *frame, size_t cap, size_t *len, int *fd);
void nvshare_outbox_sent(void);
void nvshare_outbox_after_fork(void);

/* ---- the wire: connect, register, read frames into gate events, write the outbox (client.c) -- */
void nvshare_client_start(void);
void nvshare_client_after_fork(void);

/* ---- demand (demand.c) ---------------------------------------------------------------------- */
void nvshare_demand_start(void);
void nvshare_demand_after_fork(void);

/* ---- memory accounting (memory.c) ----------------------------------------------------------- */
void nvshare_memory_resend(void);
/* MEM_UPDATE with this process's current numbers for g, through the outbox. */
void nvshare_memory_report(struct nvshare_gpu *g);
void nvshare_memory_before_fork(void);
void nvshare_memory_parent_after_fork(void);
void nvshare_memory_after_fork(void);
struct nvshare_mem_numbers {
    uint64_t resident, fixed, swapped;
};
void nvshare_mem_numbers(struct nvshare_gpu *g, struct nvshare_mem_numbers *out);

/* ---- swap (swap.c) -------------------------------------------------------------------------- */
/* The size a swappable allocation of `size` bytes takes on g, or 0 when it is not backed that way. */
size_t nvshare_swap_size(struct nvshare_gpu *g, size_t size);
/* Makes it; deferred = address only, counted as swapped. CUDA_ERROR_NOT_SUPPORTED: use cuMemAlloc. */
CUresult nvshare_swap_alloc(struct nvshare_gpu *g, CUdeviceptr *dptr, size_t size, int deferred);
/* Frees va if it is a swappable allocation of g: 1 (rc in *rc) or 0 when it is not one. */
int nvshare_swap_free(struct nvshare_gpu *g, CUdeviceptr va, CUresult *rc);
/* The whole swappable allocation that ptr lies in (what cuMemAlloc would describe): its GPU, or NULL. */
struct nvshare_gpu *nvshare_swap_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);
/* swap_mu of g: held around swap-out and swap-in, and by allocations and frees of swappable memory. */
void nvshare_swap_lock(struct nvshare_gpu *g);
void nvshare_swap_unlock(struct nvshare_gpu *g);
/* Under nvshare_swap_lock, with g's gate shut and its work drained: moves at least `bytes`
 * (UINT64_MAX: all) to host memory; returns the bytes moved. */
uint64_t nvshare_swap_out(struct nvshare_gpu *g, uint64_t bytes);
/* Under nvshare_swap_lock, gate shut: brings all of g's swapped memory back; 0 when all is resident. */
int nvshare_swap_in(struct nvshare_gpu *g);
void nvshare_swap_after_fork(void);
/* CUDA IPC (ipc.c) of swappable memory. */
struct nvshare_swap_export {
    CUdeviceptr base;      /* the whole allocation, as cuIpcGetMemHandle on real cuMemAlloc memory */
    size_t size;
    size_t chunk_bytes;    /* every chunk this size, the last one the rest */
    size_t n;
    int *fds;              /* one exported handle per chunk (malloc'd; the caller owns them) */
    uint64_t newly_fixed;  /* bytes that were swappable until now */
};
/* With the caller inside g's gate (so it is resident): fixes the allocation that ptr lies in for good
 * and exports its chunks. NOT_SUPPORTED where the GPU cannot export them as file descriptors. */
CUresult nvshare_swap_export(struct nvshare_gpu *g, CUdeviceptr ptr, struct nvshare_swap_export *out);

/* ---- CUDA IPC of swappable memory (ipc.c) ------------------------------------------------------ */
/* Exports the swappable allocation that ptr lies in (the caller inside g's gate): an nvshare handle. */
CUresult nvshare_ipc_export(struct nvshare_gpu *g, CUdeviceptr ptr, CUipcMemHandle *handle,
                            uint64_t *newly_fixed);
/* The allocation at base was freed: its handles no longer open. */
void nvshare_ipc_forget(CUdeviceptr base);
int nvshare_ipc_is_ours(const CUipcMemHandle *handle);
CUresult nvshare_ipc_open(CUdeviceptr *dptr, const CUipcMemHandle *handle, unsigned int flags);
/* 1 when dptr was opened by nvshare_ipc_open (its result in *rc); 0: the driver's. */
int nvshare_ipc_close(CUdeviceptr dptr, CUresult *rc);
void nvshare_ipc_after_fork(void);

/* sockio.c: one recvmsg (EINTR retried); descriptors that came along are appended to fds[*n_fds]
 * (closed on exec; those past max_fds are closed). Returns what recvmsg returned. */
#define NVSHARE_RECV_MAX_FDS 8
ssize_t nvshare_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *n_fds);

/* strncpy without its truncation warnings: always NUL-terminated. */
static inline void nvshare_copy_str(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Re-entrancy guard: set while the hook itself calls into the driver or the loader. */
extern NVSHARE_TLS int nvshare_in_hook;

#endif
