/* env.h: the settings of this process (the job environment nvshare-taskprolog wrote), the clock and
 * log lines (env.c). Calls nothing of the hook's: every part may use it.
 */
#ifndef NVSHARE_ENV_H
#define NVSHARE_ENV_H

#include <stdint.h>
#include <string.h>

#include "nvshare_proto.h"

/* Hidden as declared (driver.h says why). */
#pragma GCC visibility push(hidden)

enum nvshare_loss_policy { NVSHARE_LOSS_WAIT = 0, NVSHARE_LOSS_RUN = 1 };
#define NVSHARE_PREPIN_AHEAD 2   /* NVSHARE_SWAP_PREPIN=ahead: pin ahead once a grant says NVSHARE_GRANT_SWAP_AHEAD */
struct nvshare_settings {
    int active;                  /* in a job with a socket: gate and account; else pure pass-through */
    uint32_t job_id;
    uint32_t step_id;
    char socket_path[108];
    int loss_policy;
    uint64_t mem_limit;          /* NVSHARE_MEM_LIMIT bytes, 0 = none */
    int swap;                    /* NVSHARE_SWAP: back allocations so they can move to host memory */
    int swap_prepin;             /* NVSHARE_SWAP_PREPIN: pin the host copies ahead (swap.c): 1 (on) always,
                                  * 0 (off) never, NVSHARE_PREPIN_AHEAD (ahead, unset): what a grant's
                                  * SWAP_AHEAD says the GPU lacks room for */
    int alloc_budget;            /* NVSHARE_ALLOC_BUDGET: small allocations from a budget (memory.c) */
    int prompt_bursts;           /* NVSHARE_PROMPT_BURSTS: which of this job's bursts may be prompt ones
                                  * (burst.c: the others launch nothing new while one runs): PROMPT_ON (on,
                                  * the default) short, rare ones and a server's requests, PROMPT_SHORT
                                  * (short) short, rare ones only, PROMPT_OFF (off) none */
    uint64_t prompt_queue_ns;    /* NVSHARE_PROMPT_QUEUE_MS: while co-runners' prompt bursts are about, keep
                                  * at most this much of this job's work queued on the GPU (pace.c); 0: off */
    int prompt_queue_fixed;      /* ... set by the user: that cap, not one that follows the prompt bursts'
                                  * length (pace.c) */
    int prompt_hold;             /* NVSHARE_PROMPT_HOLD: how (pace.c): PROMPT_HOLD_GPU (gpu, the default) the
                                  * work stays queued and the GPU holds it while a prompt burst runs
                                  * (hold.c), PROMPT_HOLD_HOST (host) launches wait on the host */
    int prompt_early;            /* NVSHARE_PROMPT_EARLY: a job's first bursts, before its class is known
                                  * (burst.c, provisional()): 1 (hold, the default) those that may be
                                  * prompt are announced as prompt bursts for a bounded time, 0 (pace) the
                                  * others only pace */
    int corun_hold;              /* NVSHARE_CORUN_HOLD: the turn holder holds its queue on the GPU while a
                                  * co-runner's ordinary burst runs, when prompt bursts are about (burst.c,
                                  * corun_hold): 1 (on, the default), 0 (off: it runs beside it) */
    int hold_shapes;             /* NVSHARE_HOLD_SHAPES: held on the GPU, a launch whose kernel shape ran a
                                  * segment or longer gets waits of its own (pace.c): 1 (on, the
                                  * default), 0 (off: segments of the mean launch only) */
    int hold_copies;             /* NVSHARE_HOLD_COPIES: held on the GPU, a copy or set into a stream gets a wait
                                  * before it and does not wait on the host for a prompt burst (hook.c,
                                  * pace.c): HOLD_COPIES_TRAINS (the default) while the prompt job's bursts
                                  * come in trains, HOLD_COPIES_ALWAYS for any, HOLD_COPIES_OFF never */
    int prompt_cut_in;           /* NVSHARE_PROMPT_CUT_IN: a prompt burst much shorter than another's, and shorter
                                  * than what is left of that one, runs beside it rather than after it
                                  * (burst.c's cuts_in): CUT_IN_ON (the default), CUT_IN_OFF, or
                                  * CUT_IN_ALWAYS (whatever is left of that one) */
    int prompt_expect;           /* NVSHARE_PROMPT_EXPECT: a prompt job whose gaps hardly vary says when its next
                                  * burst is due, and the others hold their queues on the GPU from a little
                                  * before (burst.c's expectations): 1 (on, the default), 0 (off) */
    int prompt_shorter;          /* NVSHARE_PROMPT_SHORTER: a prompt job holds its own queue on the GPU ahead of
                                  * a much shorter prompt job's expected burst (burst.c's expectations): 0
                                  * (off, the default), 1 (on) */
    int prompt_linger;           /* NVSHARE_PROMPT_LINGER: a prompt job whose bursts come in trains keeps the
                                  * others held between them (burst.c): 1 (on, the default), 0 (off) */
    uint64_t prompt_leak_ns;     /* NVSHARE_PROMPT_LEAK_MS: held on the GPU while a prompt job's long burst
                                  * launches, this job's work leaks (prompt_leak_open_ns), then is held
                                  * this much, and so on (hold.c's leaks); 0 (off): none */
    uint64_t prompt_leak_open_ns; /* NVSHARE_PROMPT_LEAK_OPEN_MS: a leak lets this job's segments pass for this
                                  * long from the first (2 ms, the default), until the prompt job
                                  * synchronises; 0 ("segment"): one segment (or one long kernel) a leak */
    int prompt_leak_long;        /* NVSHARE_PROMPT_LEAK_LONG: a leak lets a long kernel pass (one with waits of
                                  * its own, pace.c) into any prompt burst (1, "always") or only into one
                                  * it fits (0, "fit": hold.c) */
    int prompt_leak_queued;      /* NVSHARE_PROMPT_LEAK_QUEUED: leaks go into a prompt burst that queued
                                  * right behind its job's burst before too (1, on) or not (0, off, the
                                  * default: burst.c) */
    int prompt_leak_fit;         /* NVSHARE_PROMPT_LEAK_FIT: into a prompt job's bursts that come in trains, a
                                  * leak lets this job's work pass only where it ends before the burst's
                                  * synchronise is due (1, on) or wherever it launches (0, off: hold.c) */
    int managed_all;             /* NVSHARE_MANAGED_GPUS unset: every GPU the daemon grants */
    int n_managed;
    char managed[NVSHARE_MAX_GPUS][NVSHARE_UUID_LEN];
    uint32_t drain_timeout_ms;   /* NVSHARE_DRAIN_TIMEOUT_MS: then DRAIN_STUCK, and keep waiting */
    uint32_t daemon_timeout_ms;  /* NVSHARE_DAEMON_TIMEOUT_MS: an unanswered daemon counts as lost */
    uint32_t oom_wait_sec;       /* NVSHARE_OOM_WAIT_SEC: an allocation nvshare admitted and the driver
                                  * refused for lack of memory is tried again this long (memory.c); 0: never */
    int debug;
    int log_time;                /* NVSHARE_LOG_TIME=1: each line carries its wall-clock time */
};
#define NVSHARE_DRAIN_TIMEOUT_MS_DEFAULT 5000u
#define NVSHARE_DAEMON_TIMEOUT_MS_DEFAULT 10000u
#define NVSHARE_OOM_WAIT_SEC_DEFAULT 60u
#define NVSHARE_PROMPT_QUEUE_MS_DEFAULT 1u
#define NVSHARE_PROMPT_LEAK_NS_DEFAULT 500000ull   /* 0.5 ms */
#define NVSHARE_PROMPT_LEAK_OPEN_NS_DEFAULT 2000000ull   /* 2 ms */
#define NVSHARE_PROMPT_LEAK_QUEUED_DEFAULT 0               /* off */
#define NVSHARE_PROMPT_LEAK_FIT_DEFAULT 0                  /* off */
enum { PROMPT_OFF = 0, PROMPT_SHORT = 1, PROMPT_ON = 2 };
enum { PROMPT_HOLD_HOST = 0, PROMPT_HOLD_GPU = 1 };
enum { HOLD_COPIES_OFF = 0, HOLD_COPIES_TRAINS = 1, HOLD_COPIES_ALWAYS = 2 };
enum { CUT_IN_OFF = 0, CUT_IN_ON = 1, CUT_IN_ALWAYS = 2 };
extern struct nvshare_settings nvshare_cfg;
void nvshare_read_settings(void);
int nvshare_parse_size(const char *text, uint64_t *out);
int nvshare_gpu_is_managed(const char *uuid);
uint64_t nvshare_now_ns(void);
/* A detached thread of the hook's own with this stack: pthread_create's result (0: started). */
int nvshare_start_thread(void *(*fn)(void *), void *arg, size_t stack_bytes);

/* Logging: "nvshare: job 12 step 0 pid 345: <message>", to stderr, one write per line. */
void nvshare_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void nvshare_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Text from elsewhere (the daemon's reasons) made fit for one log line: printable ASCII stays,
 * a backslash and every other byte become \\ and \xNN. Always NUL-terminated, cut to fit. */
void nvshare_escape(char *dst, size_t size, const char *src);

/* strncpy without its truncation warnings: always NUL-terminated. */
static inline void nvshare_copy_str(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

#pragma GCC visibility pop

#endif
