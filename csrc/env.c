/* env.c: the job environment this process runs in (written by nvshare-taskprolog), logging, and the
 * hook's detached threads (nvshare_start_thread: the layer every other file may call).
 *
 * Read once at load time. Anything malformed is logged and treated as unset: the hook never stops
 * the job because of its own configuration.
 */
#include <ctype.h>
#include <pthread.h>
#include <strings.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "env.h"

struct nvshare_settings nvshare_cfg;

uint64_t nvshare_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int nvshare_start_thread(void *(*fn)(void *), void *arg, size_t stack_bytes)
{
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, stack_bytes);
    int rc = pthread_create(&tid, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

static void vlog(const char *fmt, va_list ap)
{
    char line[768];
    int n;
    if (nvshare_cfg.step_id == NVSHARE_STEP_BATCH)
        n = snprintf(line, sizeof line, "nvshare: job %u step batch pid %d: ", nvshare_cfg.job_id,
                     (int)getpid());
    else
        n = snprintf(line, sizeof line, "nvshare: job %u step %u pid %d: ", nvshare_cfg.job_id,
                     nvshare_cfg.step_id, (int)getpid());
    if (n < 0 || n >= (int)sizeof line)
        return;
    if (nvshare_cfg.log_time) {   /* epoch seconds: lines of several processes set side by side */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int t = snprintf(line + n, sizeof line - (size_t)n, "@%lld.%06ld ", (long long)ts.tv_sec,
                         ts.tv_nsec / 1000);
        if (t < 0 || n + t >= (int)sizeof line)
            return;
        n += t;
    }
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = strlen(line);
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);  /* one write: lines of processes do not mix */
    (void)ignored;
}

void nvshare_log(const char *fmt, ...)
{
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
    errno = saved;
}

void nvshare_debug(const char *fmt, ...)
{
    if (!nvshare_cfg.debug)
        return;
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
    errno = saved;
}

void nvshare_escape(char *dst, size_t size, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p && size && n + 5 <= size; p++) {
        if (*p == '\\') {
            dst[n++] = '\\';
            dst[n++] = '\\';
        } else if (*p >= 0x20 && *p < 0x7f) {
            dst[n++] = (char)*p;
        } else {
            dst[n++] = '\\';
            dst[n++] = 'x';
            dst[n++] = hex[*p >> 4];
            dst[n++] = hex[*p & 15];
        }
    }
    if (size)
        dst[n] = '\0';
}

/* "1073741824", "512M", "20G", "1.5G", "64KiB": binary units. 0 on success. */
int nvshare_parse_size(const char *text, uint64_t *out)
{
    if (!text)
        return -1;
    while (isspace((unsigned char)*text))
        text++;
    if (!isdigit((unsigned char)*text))
        return -1;
    errno = 0;
    char *end;
    double value = strtod(text, &end);
    if (errno || end == text || value < 0)
        return -1;
    double scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1024.0; end++; break;
    case 'M': scale = 1024.0 * 1024; end++; break;
    case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (scale > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0')
        return -1;
    double bytes = value * scale;
    if (bytes >= 18446744073709551615.0)
        return -1;
    *out = (uint64_t)bytes;
    return 0;
}

static int parse_u32(const char *text, uint32_t *out)
{
    if (!text || !*text)
        return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || *end || v > 0xffffffffUL)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* A positive number of milliseconds from the environment, else the default (said when malformed). */
static uint32_t read_ms(const char *name, uint32_t fallback)
{
    const char *text = getenv(name);
    uint32_t ms;
    if (!text || !*text)
        return fallback;
    if (parse_u32(text, &ms) != 0 || !ms) {
        nvshare_log("%s=%s is not a positive number of milliseconds; using %u", name, text, fallback);
        return fallback;
    }
    return ms;
}

/* Milliseconds from lo to hi in the environment, as ns, or 0 for the word `zero` (any case; "0"
 * too where zero_digit); else the default (said when malformed). */
static uint64_t read_ms_or(const char *name, const char *zero, int zero_digit, double lo, double hi,
                           uint64_t fallback_ns)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return fallback_ns;
    if (!strcasecmp(text, zero) || (zero_digit && !strcmp(text, "0")))
        return 0;
    char *end = NULL;
    double ms = strtod(text, &end);
    if (end == text || *end || !(ms >= lo && ms <= hi)) {
        nvshare_log("%s=%s is not %s nor a number of milliseconds from %g to %g; using %.1f", name, text, zero,
                    lo, hi, fallback_ns / 1e6);
        return fallback_ns;
    }
    return (uint64_t)(ms * 1e6);
}

int nvshare_gpu_is_managed(const char *uuid)
{
    if (nvshare_cfg.managed_all)
        return 1;
    for (int i = 0; i < nvshare_cfg.n_managed; i++)
        if (strcmp(nvshare_cfg.managed[i], uuid) == 0)
            return 1;
    return 0;
}

/* A setting that is off when set to off, 0, false or no, on when set to on, 1, true or yes, and `dflt`
 * when unset; anything else is said once and taken as `dflt`. */
static int on_off_or(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    if (!strcasecmp(v, "off") || !strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no"))
        return 0;
    if (!strcasecmp(v, "on") || !strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
        return 1;
    nvshare_log("%s=%s is neither 'on' nor 'off'; using '%s'", name, v, dflt ? "on" : "off");
    return dflt;
}

/* A setting that is one of `names` (case aside): its index. Unset or empty: `dflt`; anything else is
 * said once, with the names, and taken as `dflt`. */
static int choice_or(const char *name, const char *const *names, int n, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(v, names[i]))
            return i;
    char list[128] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof(list); i++) {
        int w = snprintf(list + used, sizeof(list) - used, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                         names[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    nvshare_log("%s=%s is not %s; using %s", name, v, list, names[dflt]);
    return dflt;
}

/* A setting that is on unless set otherwise. */
static int on_off(const char *name)
{
    return on_off_or(name, 1);
}

void nvshare_read_settings(void)
{
    memset(&nvshare_cfg, 0, sizeof nvshare_cfg);
    nvshare_cfg.step_id = NVSHARE_STEP_BATCH;
    const char *level = getenv("NVSHARE_LOG_LEVEL");
    nvshare_cfg.debug = level && strcasecmp(level, "debug") == 0;
    const char *log_time = getenv("NVSHARE_LOG_TIME");
    nvshare_cfg.log_time = log_time && strcmp(log_time, "1") == 0;

    const char *job = getenv("NVSHARE_JOB_ID");
    if (!job || !*job)
        job = getenv("SLURM_JOB_ID");
    const char *sock = getenv("NVSHARE_SOCKET");
    const char *step = getenv("SLURM_STEP_ID");
    if (step && *step && parse_u32(step, &nvshare_cfg.step_id) != 0) {
        nvshare_log("SLURM_STEP_ID=%s is not a number; using the batch step", step);
        nvshare_cfg.step_id = NVSHARE_STEP_BATCH;
    }
    if (!job || !*job || !sock || !*sock)
        return;  /* not in an nvshare job: pure pass-through */
    if (parse_u32(job, &nvshare_cfg.job_id) != 0) {
        nvshare_log("job id '%s' is not a number; GPU sharing is off in this process", job);
        return;
    }
    if (strlen(sock) >= sizeof nvshare_cfg.socket_path) {
        nvshare_log("NVSHARE_SOCKET is longer than a Unix socket path may be; GPU sharing is off");
        return;
    }
    strcpy(nvshare_cfg.socket_path, sock);

    const char *policy = getenv("NVSHARE_ON_DAEMON_LOSS");
    nvshare_cfg.loss_policy = NVSHARE_LOSS_WAIT;
    if (policy && *policy) {
        if (strcmp(policy, "run") == 0)
            nvshare_cfg.loss_policy = NVSHARE_LOSS_RUN;
        else if (strcmp(policy, "wait") != 0)
            nvshare_log("NVSHARE_ON_DAEMON_LOSS=%s is neither 'wait' nor 'run'; using 'wait'", policy);
    }

    nvshare_cfg.drain_timeout_ms = read_ms("NVSHARE_DRAIN_TIMEOUT_MS", NVSHARE_DRAIN_TIMEOUT_MS_DEFAULT);
    nvshare_cfg.daemon_timeout_ms = read_ms("NVSHARE_DAEMON_TIMEOUT_MS", NVSHARE_DAEMON_TIMEOUT_MS_DEFAULT);
    /* The driver frees an ended process's memory some time after it ended, while the daemon counts
     * it free at once: an allocation meeting that gap waits for it (docs/design-hook.md "Memory"). */
    const char *oom_wait = getenv("NVSHARE_OOM_WAIT_SEC");
    nvshare_cfg.oom_wait_sec = NVSHARE_OOM_WAIT_SEC_DEFAULT;
    if (oom_wait && *oom_wait && parse_u32(oom_wait, &nvshare_cfg.oom_wait_sec) != 0) {
        nvshare_log("NVSHARE_OOM_WAIT_SEC=%s is not a number of seconds; using %u", oom_wait,
                    NVSHARE_OOM_WAIT_SEC_DEFAULT);
        nvshare_cfg.oom_wait_sec = NVSHARE_OOM_WAIT_SEC_DEFAULT;
    }

    const char *limit = getenv("NVSHARE_MEM_LIMIT");
    if (limit && *limit && nvshare_parse_size(limit, &nvshare_cfg.mem_limit) != 0) {
        nvshare_log("NVSHARE_MEM_LIMIT=%s is not a size (bytes, 512M, 20G); no limit set", limit);
        nvshare_cfg.mem_limit = 0;
    }

    nvshare_cfg.swap = on_off("NVSHARE_SWAP");
    const char *prepin = getenv("NVSHARE_SWAP_PREPIN");
    /* Unset: ahead. Two 45 GiB jobs on the H100 took 1.254 of serial with no pinning ahead (each
     * first swap-out pinned as it went, 1.5-1.8 GB/s) and 1.043 with it, in one run. */
    nvshare_cfg.swap_prepin = !prepin || !*prepin || !strcasecmp(prepin, "ahead") ? NVSHARE_PREPIN_AHEAD
                              : on_off("NVSHARE_SWAP_PREPIN");
    nvshare_cfg.alloc_budget = on_off("NVSHARE_ALLOC_BUDGET");
    const char *prompt = getenv("NVSHARE_PROMPT_BURSTS");
    nvshare_cfg.prompt_bursts = prompt && !strcasecmp(prompt, "short") ? PROMPT_SHORT
                                : on_off("NVSHARE_PROMPT_BURSTS") ? PROMPT_ON : PROMPT_OFF;
    /* 1 ms: a 3 ms request beside a training that queues whole 20 ms steps took 14.6 ms at p99 on the
     * H100 with yielding alone (6.3 ms alone). On the H200, beside 1 ms kernels, a server's p99 in
     * bench_mixes' mix4 was 10.3 ms with 1 and 13.3 with 2, in mix8 12.2 and 18.3 (8 s windows, one
     * call; 1 as low or lower in the three calls before), the trainings and bursty jobs as fast.
     * Set, the cap is that, fixed; unset, it follows the prompt bursts' length (pace.c, issue 42).
     * "off" or 0: no cap. */
    const char *queue = getenv("NVSHARE_PROMPT_QUEUE_MS");
    int queue_off = queue && (!strcasecmp(queue, "off") || !strcmp(queue, "0"));
    nvshare_cfg.prompt_queue_fixed = queue && *queue;
    nvshare_cfg.prompt_queue_ns = queue_off ? 0
        : (uint64_t)read_ms("NVSHARE_PROMPT_QUEUE_MS", NVSHARE_PROMPT_QUEUE_MS_DEFAULT) * 1000000ull;
    /* gpu (unset): on the H200 a 2 ms request beside a job that kept 20 ms of 100 us kernels queued
     * read 4.9 ms at p99 with that job's queue held on the GPU (4.6 alone, 11.4 co-located), and the
     * job kept 0.98 of its co-located kernels/s (bench/wait_gate_probe.cu). host: pace.c's host-side
     * waits, as before (a driver without stream memory operations gets them anyway). */
    static const char *const holds[] = {[PROMPT_HOLD_HOST] = "host", [PROMPT_HOLD_GPU] = "gpu"};
    nvshare_cfg.prompt_hold = choice_or("NVSHARE_PROMPT_HOLD", holds, 2, PROMPT_HOLD_GPU);
    static const char *const earlies[] = {"pace", "hold"};   /* prompt_early: 1 for hold */
    nvshare_cfg.prompt_early = choice_or("NVSHARE_PROMPT_EARLY", earlies, 2, 1);
    /* on (unset): on the H200 a 1 ms probe beside a training and a bursty co-runner waited for a kernel
     * of each (time-sliced) at p99, 2.9-3.4 ms against 1.1 alone (burst.c's header). off: the holder
     * runs beside a co-runner's burst, as before. */
    nvshare_cfg.corun_hold = on_off("NVSHARE_CORUN_HOLD");
    /* on (unset): held on the GPU, a launch of a kernel shape that ran a hold segment or longer gets a
     * wait before and after it (pace.c, nvshare_pace_hold). off: segments of the mean launch only, as
     * before (on the H200 an interactive step beside an fp32 training's GEMMs waited for two). */
    nvshare_cfg.hold_shapes = on_off("NVSHARE_HOLD_SHAPES");
    /* trains (unset): held on the GPU, a copy or set into a stream goes behind a wait of its own and
     * does not wait on the host while the prompt job's bursts come in trains (pace.c,
     * nvshare_pace_copy_held): on the H200 a training beside model.generate waited on the host through
     * whole requests at its steps' copies, its GPU idle (issue 42); beside a batch-1 CNN's single
     * bursts the host wait is short and spares the request the training's next step. always: for any
     * prompt burst. off: never, the rule before. */
    static const char *const copies[] = {[HOLD_COPIES_OFF] = "off", [HOLD_COPIES_TRAINS] = "trains",
                                         [HOLD_COPIES_ALWAYS] = "always"};
    nvshare_cfg.hold_copies = choice_or("NVSHARE_HOLD_COPIES", copies, 3, HOLD_COPIES_TRAINS);
    /* on (unset): model.generate's tokens are bursts of their own, each ended by a synchronise; let go
     * between two, the training ran a kernel (a 1.0-1.4 ms GEMM on the H200) that the next token waited
     * for (burst.c's linger). off: let go at every burst's end, as before. */
    nvshare_cfg.prompt_linger = on_off("NVSHARE_PROMPT_LINGER");
    /* on (unset): a prompt burst that begins while another's runs, whose job's mean span is at most
     * 2/3 of that one's (CUT_IN_PCT) and shorter than what is left of it (the page's span from its
     * begin), runs beside it rather than waiting for its end (burst.c's cuts_in): on the H200 mix8's
     * 1 ms probes waited 3.2 ms so for the server's requests. off: every prompt burst waits for the one
     * under way, as before. always: the span ratio alone, whatever is left of that one (a request that
     * overran its span too). */
    const char *cut = getenv("NVSHARE_PROMPT_CUT_IN");
    nvshare_cfg.prompt_cut_in = cut && !strcasecmp(cut, "always") ? CUT_IN_ALWAYS
                                                                   : on_off("NVSHARE_PROMPT_CUT_IN");
    /* on (unset): a prompt job whose gaps between bursts hardly vary (a command every second) says on
     * the page when its next burst is due, and the others hold their queues on the GPU from their
     * longest kernel before it (burst.c's expectations): the command meets no kernel under way. off:
     * nothing is said or heeded; a command meets the kernel under way, as before. */
    nvshare_cfg.prompt_expect = on_off("NVSHARE_PROMPT_EXPECT");
    /* off (unset): a prompt job (a server) never holds its own queue. on: it holds it on the GPU ahead
     * of the expected bursts of a prompt job whose span is at most 2/3 of its own (CUT_IN_PCT), as the
     * others do: on the H200 17 of mix8's 18 slow probes arrived inside a server's request of three
     * 1 ms kernels, which no rule held for them. Not run on a GPU yet: an A/B arm for it. */
    nvshare_cfg.prompt_shorter = on_off_or("NVSHARE_PROMPT_SHORTER", 0);
    /* 0.5 ms (unset): a host-bound server (model.generate's tokens: the GPU idle most of each burst)
     * no longer holds the training beside it for its whole burst: the training's work leaks (for
     * NVSHARE_PROMPT_LEAK_OPEN_MS), then the server has the GPU to itself for this long, and so on
     * while it launches; none while it waits in a synchronise (hold.c). On the H200 the training
     * beside generate kept 0.915 of its co-located steps/s with 0.5, 0.885 with 1, 0.855 with none
     * (one segment a leak). off or 0: held for the whole burst. */
    nvshare_cfg.prompt_leak_ns = read_ms_or("NVSHARE_PROMPT_LEAK_MS", "off", 1, 0.05, 1000,
                                            NVSHARE_PROMPT_LEAK_NS_DEFAULT);
    /* 2 ms (unset): a leak lets every segment of this job's work pass for that long from the first,
     * and no longer than the prompt job launches (its synchronise ends the leak). segment: one
     * segment (or one long kernel) a leak, the rule before: the short kernels between a training's
     * GEMMs, segments of 0.2-0.34 ms beside model.generate's tokens, ran a fraction of each leak's
     * period (hold.c). */
    nvshare_cfg.prompt_leak_open_ns = read_ms_or("NVSHARE_PROMPT_LEAK_OPEN_MS", "segment", 0, 0.05, 100,
                                                 NVSHARE_PROMPT_LEAK_OPEN_NS_DEFAULT);
    /* always (unset): a leak lets the training's long kernels pass too. fit: only into a prompt job's
     * bursts that come in trains (model.generate's tokens) or that are LEAK_LONG_FACTOR times the
     * kernel's length; into a batch-1 CNN's single 3.5 ms requests an fp32 training's 1.0-1.4 ms GEMMs
     * passed whole (hold.c). */
    static const char *const longs[] = {"fit", "always"};   /* prompt_leak_long: 1 for always */
    nvshare_cfg.prompt_leak_long = choice_or("NVSHARE_PROMPT_LEAK_LONG", longs, 2, 1);

    /* off (unset): leaks go into no request that queued (a prompt burst that began right after its
     * job's burst before, burst.c): a batch-1 CNN's p99 is made of those, each waiting for the request
     * before and its own service, both stretched by leaked GEMMs; on the H200 its p99 read 1.07x, 0.91x
     * and 1.24x alone against 1.23x, 1.14x and 1.62x with on, the training at the same steps/s (hold.c).
     * on: leaks go into every long prompt burst (the rule before). */
    nvshare_cfg.prompt_leak_queued = on_off_or("NVSHARE_PROMPT_LEAK_QUEUED",
                                               NVSHARE_PROMPT_LEAK_QUEUED_DEFAULT);
    /* off (unset): a leak into a train of prompt bursts (model.generate's tokens) lets this job's work
     * pass wherever the burst is while it launches, and the segment under way when the prompt job
     * synchronises runs to its end first: on the H200 generate's host waited 5.5-11.5 ms a request in
     * its ~19 synchronises beside an fp32 training's 1.0-2.0 ms GEMMs (0.2 alone). on: a leak (and an
     * open one's window) begins only where what it lets pass, as long as the longest this job's leaks
     * ran on after their window shut, ends before the burst's synchronise is due, 3/4 of its mean
     * length from its begin (hold.c's LEAK_FIT_SHARE_PCT). */
    nvshare_cfg.prompt_leak_fit = on_off_or("NVSHARE_PROMPT_LEAK_FIT", NVSHARE_PROMPT_LEAK_FIT_DEFAULT);

    const char *managed = getenv("NVSHARE_MANAGED_GPUS");
    nvshare_cfg.managed_all = !(managed && *managed);
    if (!nvshare_cfg.managed_all) {
        const char *p = managed;
        while (*p) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            while (len && isspace((unsigned char)*p)) { p++; len--; }
            while (len && isspace((unsigned char)p[len - 1])) len--;
            if (len && len < NVSHARE_UUID_LEN && nvshare_cfg.n_managed < NVSHARE_MAX_GPUS) {
                memcpy(nvshare_cfg.managed[nvshare_cfg.n_managed], p, len);
                nvshare_cfg.managed[nvshare_cfg.n_managed][len] = '\0';
                nvshare_cfg.n_managed++;
            } else if (len) {
                nvshare_log("NVSHARE_MANAGED_GPUS entry '%.*s' ignored", (int)len, p);
            }
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    nvshare_cfg.active = 1;
}
