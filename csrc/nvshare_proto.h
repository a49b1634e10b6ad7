/* nvshare_proto.h: the one wire format between libnvshare.so, nvshare-scheduler and its tools.
 *
 * Every frame is a struct nvshare_hdr followed by `length` payload bytes. A frame whose magic,
 * version or length is wrong is refused and that connection is closed; nothing else is disturbed.
 * Python's codec (nvshare_slurm/wire/wire.py) reads the text between NVSHARE_CDEF_BEGIN and
 * NVSHARE_CDEF_END, so that block holds only integer #defines, enums and structs of fixed-width
 * fields with literal array sizes; each message's comment in enum nvshare_msg_type names its
 * payload struct first, which is how the codec knows it. Fields are laid out naturally aligned, so
 * there is no padding to disagree on; tests check sizes and offsets from C and from Python.
 * All integers are in host byte order: both ends always run on the same node.
 */
#ifndef NVSHARE_PROTO_H
#define NVSHARE_PROTO_H

#include <stdint.h>

/* NVSHARE_CDEF_BEGIN */
#define NVSHARE_MAGIC 0x4E565348
#define NVSHARE_PROTO_VERSION 3
#define NVSHARE_HDR_SIZE 16
#define NVSHARE_MAX_PAYLOAD 1048576
#define NVSHARE_UUID_LEN 64
#define NVSHARE_MAX_GPUS 16
#define NVSHARE_TEXT_LEN 256
#define NVSHARE_NAME_LEN 128
#define NVSHARE_USER_LEN 32
#define NVSHARE_REASON_LEN 64

/* Slurm's step id of the batch script, used when SLURM_STEP_ID is not set. */
#define NVSHARE_STEP_BATCH 4294967291

enum nvshare_msg_type {
    /* libnvshare.so <-> daemon */
    NVSHARE_MSG_CLIENT_REGISTER = 1,        /* c->d  struct nvshare_client_register */
    NVSHARE_MSG_CLIENT_REGISTER_REPLY = 2,  /* d->c  struct nvshare_client_register_reply */
    NVSHARE_MSG_LOCK_REQUEST = 3,           /* c->d  struct nvshare_gpu_event */
    NVSHARE_MSG_LOCK_GRANT = 4,             /* d->c  struct nvshare_gpu_event (flags: NVSHARE_GRANT_*) */
    NVSHARE_MSG_LOCK_CONTENDED = 5,         /* d->c  struct nvshare_gpu_event: others wait; give the lock back once idle */
    NVSHARE_MSG_DROP_LOCK = 6,              /* d->c  struct nvshare_gpu_event (switch_ms: NVSHARE_DROP_* reason) */
    NVSHARE_MSG_LOCK_RELEASED = 7,          /* c->d  struct nvshare_gpu_event (flags: NVSHARE_RELEASE_*, bytes: swapped out) */
    NVSHARE_MSG_MEM_UPDATE = 8,             /* c->d  struct nvshare_mem_update; request != 0 expects MEM_REPLY */
    NVSHARE_MSG_MEM_REPLY = 9,              /* d->c  struct nvshare_mem_reply */
    NVSHARE_MSG_WAIT_FOR_MEM = 10,          /* d->c  struct nvshare_gpu_event: the GPU is over-committed, wait */
    NVSHARE_MSG_MEM_AVAILABLE = 11,         /* d->c  struct nvshare_gpu_event: memory is free again */
    NVSHARE_MSG_PREPARE_SWAP_OUT = 12,      /* d->c  struct nvshare_gpu_event: move `bytes` to host memory (docs/protocol.md "Swap") */
    NVSHARE_MSG_DRAIN_STUCK = 13,           /* c->d  struct nvshare_gpu_event: asked to release, its work there did not finish
                                               within the drain deadline (bytes: ms waited); it still holds the lock */
    NVSHARE_MSG_DEMAND = 14,                /* c->d  struct nvshare_demand: what this process asks of the GPU lately */
    NVSHARE_MSG_BURST_PAGE = 15,            /* d->c  struct nvshare_gpu_event, with one file descriptor (SCM_RIGHTS): the
                                               GPU's burst page, a sealed memfd (csrc/burst.c); sent before a grant with
                                               NVSHARE_GRANT_BURSTS when this connection has not had it */
    NVSHARE_MSG_HANDOFF = 16,               /* d->c  struct nvshare_gpu_event (flags: NVSHARE_HANDOFF_*), with one file
                                               descriptor (SCM_RIGHTS): an eventfd that the holder told DROP_LOCK writes
                                               once drained and the next holder waits on (docs/protocol.md "Hand-over");
                                               advisory: the next holder's LOCK_GRANT follows as always */
    NVSHARE_MSG_RESUMED = 17,               /* d->c  struct nvshare_gpu_event: its job runs again after a suspend that asked it to
                                               move memory out (DROP_LOCK(SUSPEND), PREPARE_SWAP_OUT): a swap-out on that GPU
                                               still pending or under way stops (docs/protocol.md "Suspend") */
    NVSHARE_MSG_PREFETCH = 18,              /* d->c  struct nvshare_gpu_event: it waits for the GPU and memory is free: bring
                                               up to `bytes` of its swapped memory back now, its gate still shut; answered by
                                               a MEM_UPDATE with NVSHARE_MEM_PREFETCH_DONE (docs/protocol.md "Swap" 8) */
    /* prolog / epilog / taskprolog / status <-> daemon; each request gets exactly one reply */
    NVSHARE_MSG_JOB_REGISTER = 20,          /* root->d  struct nvshare_job_register -> JOB_REPLY */
    NVSHARE_MSG_JOB_UNREGISTER = 21,        /* root->d  struct nvshare_job_id -> REPLY */
    NVSHARE_MSG_JOB_QUERY = 22,             /* any->d   struct nvshare_job_id -> JOB_REPLY (own jobs, or root) */
    NVSHARE_MSG_JOB_REPLY = 23,             /* d->any   struct nvshare_job_reply */
    NVSHARE_MSG_STATUS_QUERY = 24,          /* any->d   struct nvshare_status_query -> STATUS_REPLY */
    NVSHARE_MSG_STATUS_REPLY = 25,          /* d->any   struct nvshare_status_reply, then json_length bytes of UTF-8 JSON */
    NVSHARE_MSG_ADMIN_UPDATE = 26,          /* root/SlurmUser->d  struct nvshare_admin_update -> REPLY */
    NVSHARE_MSG_REPLY = 27,                 /* d->any   struct nvshare_reply */
    NVSHARE_MSG_HEARTBEAT = 28,             /* either way  struct nvshare_heartbeat; the daemon echoes it */
    NVSHARE_MSG_DEVICE_OPEN = 29            /* job process->d  struct nvshare_device_open -> REPLY, with one file
                                               descriptor (SCM_RIGHTS) when OK: the GPU's device file, opened by the
                                               daemon for a process that Slurm's device cgroup keeps from it */
};

enum nvshare_status {
    NVSHARE_OK = 0,
    NVSHARE_ERR_PERM = 1,       /* peer credentials do not allow this */
    NVSHARE_ERR_NOJOB = 2,      /* job not registered on this node */
    NVSHARE_ERR_INVAL = 3,      /* a field is out of range */
    NVSHARE_ERR_NOGPU = 4,      /* no such GPU, or not one this job was placed on */
    NVSHARE_ERR_NOMEM = 5,      /* can never fit, or over the job's NVSHARE_MEM_LIMIT */
    NVSHARE_ERR_PROTO = 6,      /* malformed frame */
    NVSHARE_ERR_INTERNAL = 7
};

/* nvshare_gpu_event.flags in LOCK_GRANT */
#define NVSHARE_GRANT_EXCLUSIVE 0
#define NVSHARE_GRANT_SHARED 1      /* co-running with other holders (auto mode, memory fits) */
#define NVSHARE_GRANT_BURSTS 2      /* with SHARED: take turns burst by burst with the other co-runners, through the
                                       GPU's burst page (if it came) */
#define NVSHARE_GRANT_SWAP_AHEAD 4  /* exclusive turns with swap (the memory does not fit): this job's memory is
                                       likely asked out at its turn's end: with NVSHARE_SWAP_PREPIN=ahead its hook
                                       starts pinning the host copies then */
#define NVSHARE_GRANT_YIELD 8       /* a turn holder beside co-runners (auto_share adaptive, burst_turns): launch
                                       nothing new while a co-runner's prompt burst runs (the burst page, which
                                       came before; BURSTS implies it) */
/* nvshare_gpu_event.flags in LOCK_RELEASED */
#define NVSHARE_RELEASE_DROPPED 0   /* answer to DROP_LOCK */
#define NVSHARE_RELEASE_IDLE 1      /* given back early: no work in flight while others wait */
#define NVSHARE_RELEASE_SWAPPED 2   /* memory was swapped out (bytes says how much) */
#define NVSHARE_RELEASE_NO_ROOM 4   /* granted, but its swapped memory could not be brought back */
/* nvshare_gpu_event.flags in HANDOFF */
#define NVSHARE_HANDOFF_FROM 1      /* to the holder, before its DROP_LOCK: write the eventfd once drained */
#define NVSHARE_HANDOFF_TO 2        /* to the next holder: the eventfd written means the GPU is free for it */
/* nvshare_gpu_event.switch_ms in DROP_LOCK: why */
#define NVSHARE_DROP_TIMESLICE 1
#define NVSHARE_DROP_MAX_RUNTIME 2
#define NVSHARE_DROP_ADMIN 3
#define NVSHARE_DROP_MEMORY 4
#define NVSHARE_DROP_SUSPEND 5     /* its job is being suspended (Slurm): move `bytes` out, ask again when you like;
                                      the daemon grants nothing to a suspended job until it resumes (then RESUMED) */

/* nvshare_mem_update.flags */
#define NVSHARE_CLIENT_PREFETCH 1   /* CLIENT_REGISTER: this hook answers PREFETCH (others are never sent one) */

#define NVSHARE_MEM_CAN_DEFER 1     /* this allocation can be made without GPU memory until the next grant */
/* nvshare_mem_reply.flags */
#define NVSHARE_MEM_DEFERRED 1      /* no room now: make it swapped out; it becomes resident at the next grant */
#define NVSHARE_MEM_PREFETCH_DONE 2 /* a report (request 0) that ends a PREFETCH: what it could bring back is back */
#define NVSHARE_MEM_PREFETCH_SHORT 4 /* with _DONE: it stopped before the bytes offered (the GPU had no room, or it
                                       cannot bring memory back): offer no more before its next grant */
#define NVSHARE_MEM_MOVING 8        /* a report (request 0) in the middle of a swap-out: more is moving out, so it is
                                       not yet the answer to a PREPARE_SWAP_OUT */
#define NVSHARE_MEM_DRIVER_OOM 16   /* a question (request: the bytes) after the driver refused an allocation that
                                       nvshare admitted with CUDA_ERROR_OUT_OF_MEMORY (memory the daemon does not
                                       count, e.g. an ended process's the driver has not freed yet), with
                                       driver_free_mib; the hook tries the driver again after the MEM_REPLY, which
                                       the daemon may hold until it sees room (docs/protocol.md "Memory") */

/* nvshare_job_register.flags */
#define NVSHARE_JOB_GPUS_GIVEN 1    /* gpu_index[] is Slurm's choice (typed GRES or gpu/shard GRES) */
/* Bits 1-2: the job's share class, from the site's priority_classes map (the prolog, as root, so a
 * user never sets it). 0 is normal, so a registration without a class is a normal job; 6 is refused. */
#define NVSHARE_JOB_CLASS_MASK 6
#define NVSHARE_JOB_CLASS_NORMAL 0
#define NVSHARE_JOB_CLASS_HIGH 2
#define NVSHARE_JOB_CLASS_LOW 4
/* The job holds nvshare GPUs on two or more nodes (the prolog, from slurmctld's record): its
 * clients here take the turns of multi-node jobs, in job-id order on every node
 * (docs/design-scheduler.md "Multi-node jobs"). */
#define NVSHARE_JOB_MULTINODE 8

/* nvshare_status_query.what */
#define NVSHARE_STATUS_GPUS 1
#define NVSHARE_STATUS_JOBS 2
#define NVSHARE_STATUS_JOB 3
#define NVSHARE_STATUS_CONFIG 4

/* nvshare_admin_update: a field set to NVSHARE_KEEP is left as it is */
#define NVSHARE_KEEP -1
#define NVSHARE_MODE_AUTO 0
#define NVSHARE_MODE_CONCURRENT 1
#define NVSHARE_MODE_SERIAL 2
#define NVSHARE_SWITCH_AUTO 0
#define NVSHARE_SWITCH_FIXED 1

struct nvshare_hdr {
    uint32_t magic;             /* NVSHARE_MAGIC */
    uint16_t version;           /* NVSHARE_PROTO_VERSION */
    uint16_t type;              /* enum nvshare_msg_type */
    uint32_t length;            /* payload bytes after the header, <= NVSHARE_MAX_PAYLOAD */
    uint32_t seq;               /* chosen by the requester; a reply echoes it */
};

struct nvshare_client_register {
    uint32_t job_id;
    uint32_t step_id;           /* SLURM_STEP_ID, or NVSHARE_STEP_BATCH */
    int32_t pid;                /* must equal the peer's SO_PEERCRED pid */
    uint32_t flags;             /* NVSHARE_CLIENT_* (a daemon that does not know a bit ignores it) */
    uint64_t mem_limit;         /* NVSHARE_MEM_LIMIT in bytes, 0 = none */
};

struct nvshare_client_register_reply {
    int32_t status;             /* enum nvshare_status */
    uint32_t idle_release_us;   /* starting idle threshold for early release */
    uint64_t client_id;
    char message[256];          /* NVSHARE_TEXT_LEN, NUL-terminated */
};

struct nvshare_gpu_event {
    char gpu_uuid[64];          /* NVSHARE_UUID_LEN, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", NUL-padded */
    uint32_t flags;
    uint32_t switch_ms;         /* GRANT: switch interval in force; DROP_LOCK: NVSHARE_DROP_* */
    uint64_t bytes;
};

struct nvshare_mem_update {
    char gpu_uuid[64];
    uint64_t allocated;         /* device memory this process holds on that GPU now */
    uint64_t fixed;             /* the part of allocated that can never be swapped */
    uint64_t swapped;           /* bytes of this process now held in host memory */
    uint64_t request;           /* an allocation about to be made; 0 = report only, no reply */
    uint32_t flags;             /* NVSHARE_MEM_* (with request) */
    uint32_t driver_free_mib;   /* with NVSHARE_MEM_DRIVER_OOM: the driver's free memory, MiB; else 0 */
};

struct nvshare_demand {
    char gpu_uuid[64];
    uint32_t busy_ppm;          /* share of recent time (about 1 s) with GPU work launched, in flight or waiting for the lock, per million */
    uint32_t burst_us;          /* mean length of a busy stretch */
    uint32_t gap_us;            /* mean length of an idle stretch between two busy ones */
    uint32_t gap_spread_ppm;    /* mean deviation of the gaps from their mean, over that mean, per million:
                                   ~0.74 for gaps as irregular as random arrivals (a server's requests), near 0
                                   for a training's fixed host pauses; NVSHARE_SPREAD_UNKNOWN while fewer than
                                   2 gaps are measured; 0 from hooks before issue 42 */
};
#define NVSHARE_SPREAD_UNKNOWN 4294967295

struct nvshare_mem_reply {
    char gpu_uuid[64];
    int32_t status;             /* NVSHARE_OK, or NVSHARE_ERR_NOMEM */
    uint32_t flags;             /* NVSHARE_MEM_DEFERRED */
    uint64_t available;         /* what this process may still allocate there (the job's view) */
    uint64_t total;             /* what cuMemGetInfo should report as total */
};

struct nvshare_job_register {
    uint32_t job_id;
    uint32_t uid;
    uint32_t gid;
    uint32_t slots;             /* --gres=nvshare:N on this node; 0 when gpu_index[] is given */
    uint32_t flags;             /* NVSHARE_JOB_* */
    uint32_t n_gpus;            /* entries used in gpu_index[] */
    int32_t gpu_index[16];      /* NVML indices chosen by Slurm (NVSHARE_MAX_GPUS) */
    uint64_t reserved;          /* 0 (was a job-wide cap that nothing set; NVSHARE_MEM_LIMIT is per process) */
    char name[128];             /* job name, for status only (NVSHARE_NAME_LEN) */
    char user[32];              /* NVSHARE_USER_LEN */
    char class_reason[64];      /* why that class, e.g. "qos prod" (status only; NVSHARE_REASON_LEN) */
};

struct nvshare_job_id {
    uint32_t job_id;
    uint32_t flags;             /* reserved, 0 */
};

struct nvshare_job_reply {
    int32_t status;
    uint32_t n_gpus;
    char gpu_uuid[16][64];      /* [NVSHARE_MAX_GPUS][NVSHARE_UUID_LEN] the placed GPUs */
    int32_t gpu_index[16];
    char message[256];
};

struct nvshare_status_query {
    uint32_t what;              /* NVSHARE_STATUS_* */
    uint32_t job_id;            /* with NVSHARE_STATUS_JOB */
};

struct nvshare_status_reply {
    int32_t status;
    uint32_t json_length;       /* UTF-8 JSON follows the struct in the same frame */
};

struct nvshare_admin_update {
    char gpu[64];               /* UUID, NVML index or "all" */
    int32_t mode;               /* NVSHARE_MODE_* or NVSHARE_KEEP */
    int32_t switch_mode;        /* NVSHARE_SWITCH_* or NVSHARE_KEEP */
    int32_t switch_time_ms;     /* fixed interval, or NVSHARE_KEEP */
    int32_t memory_reserve_percent;
    int32_t max_runtime_sec;
    uint32_t reserved;
};

struct nvshare_reply {
    int32_t status;
    uint32_t reserved;
    char message[256];
};

struct nvshare_device_open {
    uint32_t job_id;
    uint32_t step_id;           /* SLURM_STEP_ID, or NVSHARE_STEP_BATCH (log lines only) */
    uint32_t dev_major;         /* the device file the process could not open (stat's st_rdev) */
    uint32_t dev_minor;
    uint32_t access;            /* O_RDONLY, O_WRONLY or O_RDWR */
    uint32_t reserved;          /* 0 */
};

struct nvshare_heartbeat {
    uint64_t timestamp_ns;
};
/* NVSHARE_CDEF_END */

#endif
