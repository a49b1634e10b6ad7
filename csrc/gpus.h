/* gpus.h: the record of each GPU this process uses, and which GPU a call is for (gpus.c).
 *
 * The record is one part per owner: `gate` is written only by gate.c (and the interposition layer's
 * counters on its hot path), `burst` only by burst.c, `mem` only by memory.c, `swap` only by swap.c,
 * `pace` only by pace.c, `hold` only by hold.c.
 * A part is read by the layers above its owner, through the owner's header where it takes more than a
 * load. The identity (uuid, device, primary context, mode) belongs to gpus.c, which also gives a new
 * record each part's starting state. Calls only outbox.c (is the link up), client.c (start it),
 * driver.c and env.c.
 */
#ifndef NVSHARE_GPUS_H
#define NVSHARE_GPUS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cuda_subset.h"
#include "nvshare_proto.h"

/* Hidden as declared (driver.h says why). */
#pragma GCC visibility push(hidden)

enum nvshare_gpu_mode { GPU_UNKNOWN = 0, GPU_GATED = 1, GPU_PASS = 2 };
#define NVSHARE_MAX_POOLS 32
struct nvshare_swap_entry;
struct nvshare_burst_page;

/* gate.c's: the lock of this GPU and the gate every GPU-bound call passes. */
struct nvshare_gate_state {
    /* hot path: atomics only */
    atomic_int open;              /* entries pass straight in: lock held, or pass-through */
    atomic_uint opens;            /* times it opened: swap.c's chunks untouched since a prefetch */
    atomic_int closing;           /* a release is draining the gate: new entries wait */
    atomic_int inside;            /* threads between gate_enter and gate_leave */
    atomic_int beginning;         /* threads that began a burst and are not inside yet (demand.c) */
    atomic_int touched;           /* set by every entry, cleared by the keeper: idleness */
    atomic_int demand_touched;    /* set by every entry, taken by the demand sampler */
    atomic_int syncing;           /* threads in a synchronising call: waiting for this GPU's work */
    _Atomic uint64_t sync_began_ns;   /* when syncing last went from 0 to 1 (demand.c) */
    _Atomic uint64_t sync_ended_ns;   /* ... and from 1 to 0 */
    atomic_int captures;          /* graph captures open on this GPU: no synchronise meanwhile */
    /* What the demand sampler saw (demand.c tells it, nvshare_gate_note_demand): since when no work
     * entered or ran (0: busy now, or nothing seen yet), the mean idle stretch, the busy share. */
    _Atomic uint64_t idle_since_ns;
    _Atomic uint64_t gap_mean_ns;
    atomic_uint busy_ppm;
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
    uint64_t idle_threshold_ns;
    uint64_t last_release_ns;
    int last_release_idle;
    int quick_reasks;             /* idle releases in a row asked again within a quarter pause */
    uint64_t granted_ns;
    uint64_t swap_out_bytes;      /* move at least this much to host memory at the next release */
    uint64_t swap_now_bytes;      /* PREPARE_SWAP_OUT while not holding: the keeper moves it now */
    uint64_t prefetch_bytes;      /* PREFETCH while waiting: the keeper brings up to this much back now */
    int swap_in_pending;          /* granted with memory in host memory: bring it back, then open */
    int swap_busy;                /* the keeper moves memory now: a grant must wait for it */
    int swap_cancel;              /* RESUMED came during a drain: the swap-out after it moves nothing */
    uint64_t no_room_until;       /* swap-in failed for lack of GPU memory: ask again after this */
    /* Hand-over between exclusive turns (HANDOFF): eventfds shared with one other process. */
    int handoff_out_fd;           /* holding: write it once drained (-1: none) */
    int handoff_in_fd;            /* waiting: the holder writes it when the GPU is ours (-1: none) */
    unsigned handoff_gen;         /* bumped with every new handoff_in_fd */
    int handoff_polling;          /* a waiting thread polls (a copy of) handoff_in_fd */
    int handoff_on_drain;         /* this release moves nothing: the drainer writes handoff_out_fd */
    int last_yields;              /* the last grant said YIELD: a hand-over yields so until its grant */
};

/* burst.c's: co-runners take turns burst by burst through a page they share. */
#define NVSHARE_PERIOD_GAPS 4   /* burst.c's expectations judge a job's pace by its last this many gaps */
struct nvshare_burst_state {
    _Atomic(struct nvshare_burst_page *) page;  /* the shared page (BURST_PAGE), NULL: none */
    atomic_int armed;             /* co-running with bursts taking turns (a shared grant) */
    atomic_int in_burst;          /* a burst of this process is under way (or waiting to begin) */
    atomic_int owner;             /* ... and owns the page */
    atomic_int waiting;           /* threads waiting for another job's burst to end */
    _Atomic uint64_t mean_ns;     /* this process's mean burst (demand.c measures it) */
    atomic_uint busy_ppm;         /* ... and its busy share */
    atomic_uint bursts;           /* ... and how many bursts that mean is of */
    _Atomic uint64_t gap_ns;      /* ... the mean gap between bursts, its mean deviation (demand.c), */
    _Atomic uint64_t gap_dev_ns;
    atomic_uint gaps;             /* ... of how many gaps, */
    _Atomic uint64_t idle_since;  /* ... since when it is idle (0: busy), */
    _Atomic uint64_t seen_ns;     /* ... and over how long its work was sampled */
    atomic_int serving;           /* its gaps are a server's (burst.c's serves_now) */
    _Atomic uint64_t served_ns;   /* ... when its gaps last said so */
    int timeouts_row;             /* these three: only the thread that began the burst (in_burst) */
    uint64_t ignore_until;
    int early_bursts;             /* bursts announced early (burst.c, early_hold): PROMPT_MIN_BURSTS at most */
    /* Prompt bursts (burst.c): short, rare bursts that co-runners and the turn holder let run alone. */
    atomic_int yields;            /* wait out others' prompt bursts (a grant's BURSTS or YIELD) */
    atomic_int prompting;         /* the burst under way is prompt: prompt_mine is on the page */
    atomic_int prompt_kind;       /* this process's bursts were prompt at the last burst's start */
    _Atomic uint64_t prompt_mine; /* the prompt_until this process wrote */
    _Atomic uint64_t yield_window_ns;    /* the start of the second whose waits are counted */
    _Atomic uint64_t yielded_ns;         /* waited for prompt bursts in that second */
    _Atomic uint64_t yield_ignore_until; /* waited a budget's worth: ignore prompt bursts till then */
    _Atomic uint64_t next_mine;   /* the prompt_next_until this process wrote (waiting its turn) */
    atomic_int sync_marked;       /* a synchronise of its prompt burst is counted on the page (prompt_syncing) */
    _Atomic uint64_t ended_ns;    /* when its last burst ended (0: none yet) */
    _Atomic uint64_t began_ns;    /* when its burst under way (or its last one) began */
    _Atomic uint64_t span_ns;     /* how long its last burst ran, begin to end (0: none yet) */
    atomic_uint train_ppm;        /* the share of its gaps between bursts that are short (a train: burst.c's
                                     linger), a running mean */
    _Atomic uint64_t train_gap_ns; /* ... and their mean length */
    atomic_uint lone_ppm;         /* the share of its bursts after a long gap whose next gap was long too */
    atomic_int after_long;        /* its last burst began after a long gap */
    _Atomic uint64_t linger_mine; /* the prompt_until its last prompt burst's end wrote (lingering), 0: none */
    _Atomic uint64_t prompt_began_mine; /* when its prompt burst under way began */
    _Atomic uint64_t prompt_span_ns;    /* its prompt bursts' mean span, begin to end (the page's prompt_span_ns) */
    _Atomic uint64_t period_ring[NVSHARE_PERIOD_GAPS]; /* its last gaps from a burst's end to the next one's
                                         begin (burst.c's expectations), */
    atomic_uint period_gaps;            /* ... and how many there were */
    unsigned expect_said;               /* the log said its bursts come on time */
    /* A turn holder held on the GPU while a co-runner's ordinary burst runs (burst.c's corun_hold):
     * only hold.c's watcher touches these. */
    uint64_t corun_window_ns;     /* the start of the second whose holds are counted */
    uint64_t corun_used_ns;       /* held for co-runners' bursts in that second, the hold under way left out */
    uint64_t corun_since;         /* the hold under way began (counted from), 0: none */
    uint64_t corun_burst_start;   /* ... held for the co-runner burst under way since */
    uint32_t corun_seq;           /* ... that burst: the page's seq then */
    uint32_t corun_done_seq;      /* held as long as one burst may ask: not again for this one */
    int corun_done;
    uint64_t corun_ignore_until;  /* held a budget's worth: not again before this */
};

/* memory.c's, under memory.c's mutex: what this process allocated here. */
struct nvshare_mem_state {
    uint64_t allocated;           /* every byte this process allocated here: resident + swapped */
    CUmemoryPool pools[NVSHARE_MAX_POOLS];  /* stream-ordered pools on this GPU */
    int n_pools;
    _Atomic uint64_t pool_bytes;  /* their reserved memory (and graph memory), last sampled */
    _Atomic uint64_t small_budget;  /* small allocations admitted without asking */
};

/* swap.c's: swappable backing (VMM) and where its bytes are. */
struct nvshare_swap_state {
    _Atomic uint64_t swappable;   /* resident bytes that can move */
    _Atomic uint64_t swapped;     /* bytes not on the GPU now (in host memory, or not yet created) */
    pthread_mutex_t mu;           /* around swap-out, swap-in, and swappable allocations and frees */
    struct nvshare_swap_entry *entries;
    size_t count, cap;
    int vmm;                      /* -1 not known yet, 0 unsupported, 1 usable */
    int blocked;                  /* host memory could not take a swap: report everything fixed */
    atomic_int peer_access;       /* another GPU's context may reach this one's memory: never swapped */
    atomic_int abort;             /* a grant came during a PREPARE_SWAP_OUT swap, or RESUMED: stop moving out */
    int prepin_running;           /* NVSHARE_SWAP_PREPIN: the thread that pins host copies ahead runs */
    _Atomic uint64_t prepin_target;  /* ... pinning the newest chunks' copies up to this many bytes */
    size_t granularity;
    int fd_export;                /* chunks are made exportable as file descriptors (CUDA IPC) */
    int rdma;                     /* the GPU takes GPUDirect RDMA on VMM memory: ask for it, as cuMemAlloc has it */
    int n_access;
    CUmemAccessDesc access[NVSHARE_MAX_GPUS];
};

/* pace.c's, under mu: while co-runners' prompt bursts are about, an event after this process's
 * launches tells how much of its work is still queued on the GPU. */
#define NVSHARE_PACE_RING 32
struct nvshare_pace_slot {
    CUevent ev;                   /* made in `ctx`; NULL: not made yet (or lost with its context) */
    CUstream stream;              /* where it was recorded */
    uint32_t launches;            /* the launches it marks the end of */
    int behind;                   /* recorded while the slot before it, same stream, was still queued */
    uintptr_t shape;              /* the shape of its one launch, measured alone (0: none) */
    unsigned holds;               /* hold.c's nvshare_hold_count() when it was recorded, */
    int held;                     /* ... and the queue held then (no measurement starts from it) */
};
/* A launch's shape (its kernel at one grid and block, or a graph), and its GPU time measured alone:
 * the longest lately (a longer one counts at once, a shorter one an eighth). Two ways per set. */
#define NVSHARE_PACE_SHAPES 256
struct nvshare_pace_shape {
    uintptr_t key;                /* pace.h's nvshare_pace_shape_key(); 0: free */
    uint64_t ns;
};
struct nvshare_pace_state {
    pthread_mutex_t mu;
    CUcontext ctx;                /* the context the events were made in */
    struct nvshare_pace_slot ring[NVSHARE_PACE_RING];
    unsigned head, n;             /* the slots whose events have not been seen done: ring[head..head+n) */
    int last_done;                /* the slot seen done last, its event as recorded then (-1: none) */
    uint32_t unmarked;            /* launches since the last event */
    uint64_t launch_ns;           /* GPU time of one launch, back to back (a running mean; 0: unknown) */
    uint64_t off_until;           /* a wait ran out: not pacing until then */
    uint64_t paced_ns;            /* the last paced launch (the log says when pacing begins) */
    uint64_t looked_ns;           /* held: when forget_done() last looked at the events */
    uint64_t cap;                 /* the queue cap of the last paced launch (pace_wait's, for its event) */
    uint64_t cap_said;            /* the cap the log said last (and again when it moves) */
    uint32_t unwaited;            /* held on the GPU (hold.c): launches since the last wait put in */
    int after_long;               /* held: the last launch's shape runs a segment or longer */
    unsigned shapes_said;         /* long shapes the debug log named */
    struct nvshare_pace_shape shapes[NVSHARE_PACE_SHAPES];
};

/* hold.c's: this process's queued work, held on the GPU while a co-runner's prompt burst runs. */
enum { NVSHARE_HOLD_UNTRIED = 0, NVSHARE_HOLD_READY = 1, NVSHARE_HOLD_FAILED = 2 };
struct nvshare_hold_state {
    atomic_int state;             /* NVSHARE_HOLD_*: the word made and its watcher started, or not possible */
    _Atomic(_Atomic(uint32_t) *) word;  /* pinned host memory the GPU sees: 1 holds this process's streams at
                                     their next wait, 0 lets them run (its watcher alone writes 1) */
    CUdeviceptr dword;            /* ... its address on the GPU */
    CUcontext ctx;                /* the context the word was mapped in (waits go only into it) */
    atomic_uint holds;            /* times the word was set: a queue held between two events makes
                                     their elapsed time no launch's (pace.c) */
    _Atomic(_Atomic(uint32_t) *) passed;  /* beside the word: the GPU writes the number of each wait it
                                     passed there (hold.c's leaks let one segment pass), NULL: it cannot */
    CUdeviceptr dpassed;          /* ... its address on the GPU, and that of the word it writes a wait's
                                     number into as it comes to it */
    CUdeviceptr darrived;
    atomic_uint tickets;          /* waits put in so far (the last number written after one) */
    CUdeviceptr dlong;            /* beside the word, the one a long kernel's wait waits on: set with the word,
                                     let go by a leak only into a prompt burst it fits (hold.c) */
    _Atomic uint64_t long_ns;     /* the longest kernel pace.c measured that got waits of its own */
    uint64_t leak_over_ns;        /* how long this job's work ran on after a leak's window shut (a decaying
                                     maximum: hold.c's watcher alone reads and writes it) */
};

struct nvshare_gpu {
    char uuid[NVSHARE_UUID_LEN];
    CUdevice device;              /* ordinal in this process */
    atomic_int mode;              /* enum nvshare_gpu_mode: gated, or pass-through (gate.c decides) */
    CUcontext primary;            /* the primary context, as retained through the hook */
    struct nvshare_gate_state gate;
    struct nvshare_burst_state burst;
    struct nvshare_mem_state mem;
    struct nvshare_swap_state swap;
    struct nvshare_pace_state pace;
    struct nvshare_hold_state hold;
};

extern struct nvshare_gpu nvshare_gpus[NVSHARE_MAX_GPUS];
extern atomic_int nvshare_n_gpus;

struct nvshare_gpu *nvshare_gpu_for_current(void);
struct nvshare_gpu *nvshare_gpu_for_device(CUdevice dev);
struct nvshare_gpu *nvshare_gpu_for_ctx(CUcontext ctx);
struct nvshare_gpu *nvshare_gpu_by_uuid(const char *uuid);
void nvshare_ctx_forget(CUcontext ctx);
void nvshare_ctx_remember(CUcontext ctx, CUdevice dev);
/* A context of this process on g (for the hook's own copies), or NULL. */
CUcontext nvshare_ctx_for_gpu(struct nvshare_gpu *g);
/* Synchronises every context of g, without holding the table's lock across a synchronise. */
CUresult nvshare_gpus_sync_contexts(struct nvshare_gpu *g);
/* The primary context of dev, retained through the hook; gone after a reset or its last release. */
void nvshare_primary_ctx_retained(CUdevice dev, CUcontext ctx);
CUcontext nvshare_primary_ctx_gone(CUdevice dev);
/* A condition variable on CLOCK_MONOTONIC, as every timed wait of the hook expects. */
void nvshare_cond_init(pthread_cond_t *cv);
void nvshare_gpus_after_fork(void);

#pragma GCC visibility pop

#endif
