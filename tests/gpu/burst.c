/* burst.c: a bursty GPU job that starts in a fraction of a second (bench/bench_family.py, issue 12).
 *
 * Every step is a burst of real GPU work, then a host pause: the burst is GPU_MS of FMA-bound
 * kernels (each about KERNEL_MS, filling every SM) and a cuCtxSynchronize, as a training step ends
 * in a .item(); the pause is a host sleep, either fixed (HOST_MS) or proportional to the step just
 * measured (HOST_RATIO x its wall time, so a job slowed by sharing also thinks longer, as host work
 * that follows the GPU's output does). Python and PyTorch cost seconds to start; this costs the CUDA
 * context, so a benchmark member can run for a few seconds of steady state.
 *
 * It speaks only the driver API, through dlopen/dlsym as the CUDA runtime does, so the same binary
 * runs on a GPU and on the fake driver of tests/c. Its kernel is named "sleep" and its first
 * parameter is a count: on a GPU, FMA iterations per thread; the fake driver reads it as
 * microseconds. --calibrate times that count on this GPU and prints iterations per millisecond.
 *
 *   burst --calibrate [--kernel-ms 1]
 *   burst --ipm N --gpu-ms G [--kernel-ms 1] (--host-ms H | --host-ratio R) (--steps S | --seconds T)
 *         [--start-delay SECONDS] [--start-at EPOCH_SECONDS] [--gpu-times]
 *         [--poisson-ms MEAN [--seed N]] [--mem-mib M] [--duty RUN:IDLE]
 *
 * --poisson-ms: a serving member (bench/bench_mixes.py): requests arrive open-loop at exponential
 * intervals of MEAN ms (seeded), each one step (--host-ms is then 0); a request that arrives while
 * the last one runs waits for it, and its latency is from its arrival to its synchronise. --mem-mib
 * allocates that much more device memory at start (a memory-heavy member) and keeps it; a 1 MiB
 * sample every 64 MiB of it is written with a pattern of the seed at start and read back after the
 * last step ("mem_check": "ok", or "bad N" samples that differ): memory swapped out and back while
 * the job shares the GPU must come back as it was, as a training's losses must stay bit-identical.
 *
 * --duty RUN:IDLE steps RUN seconds, then idles IDLE seconds (no GPU work, its memory kept), in turn;
 * "idle" lists each idle phase's [begin, end] (epoch seconds): a server beside it has requests beside
 * the job stepping and beside it idle in one run (bench/interactive_step.py --duty, train.py's --duty).
 *
 * --start-at holds the first step until that wall-clock time: jobs started together begin their
 * steps at offsets the caller chose, whatever their start-ups did (bursty jobs with fixed pauses keep
 * the phase they start in, so a comparison of arms must start them in the same one). A start-up
 * that ends past it starts at once and reports "start_at_late_ms".
 * Prints one JSON line: each step's start, when its launches had returned ("issued": a launch the
 * hook held shows there) and end (epoch seconds, as time.time()), its burst's
 * latency in ms (issue to synchronise, what an interactive user waits), and the start-up time.
 * --gpu-times adds "gpu_kernels": [[start_ns, end_ns], ...], each measured-step kernel's first block
 * start and last block end in %globaltimer, one clock for every context on the GPU, so two jobs'
 * kernels show how long the GPU sat idle when it passed from one to the other. The first
 * MAX_TIMED_LAUNCHES launches are recorded; "gpu_kernels_unrecorded" counts the rest, and those a
 * driver did not run as PTX (the fake driver of tests/c: no kernel times there).
 * Build: cc -O2 -std=gnu11 -I csrc -o burst tests/gpu/burst.c -ldl -lm
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_subset.h"

/* FMA-bound: four independent chains per thread, so the SMs' FMA pipes, not latency, set the pace.
 * times: 0, or this launch's {start, end} slot; thread 0 of each block folds its block's start and
 * end into it (min, max), so the slot ends up as the kernel's first start and last end. times is the
 * same for the whole grid, so the branch around the barrier never diverges. */
static const char PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry sleep(.param .u64 iters, .param .u64 out, .param .u64 times)\n{\n"
    "  .reg .pred p, timed, lead;\n  .reg .f32 a<4>, b, c;\n  .reg .u64 i, n, addr, off, slot, t;\n"
    "  .reg .u32 tid, ntid, ctaid, gid;\n"
    "  mov.u32 tid, %tid.x;\n  ld.param.u64 slot, [times];\n  setp.ne.u64 timed, slot, 0;\n"
    "  setp.eq.and.u32 lead, tid, 0, timed;\n  @lead mov.u64 t, %globaltimer;\n"
    "  cvta.to.global.u64 slot, slot;\n  @lead red.global.min.u64 [slot], t;\n"
    "  ld.param.u64 n, [iters];\n  ld.param.u64 addr, [out];\n  cvta.to.global.u64 addr, addr;\n"
    "  mov.u32 ntid, %ntid.x;\n  mov.u32 ctaid, %ctaid.x;\n"
    "  mad.lo.u32 gid, ctaid, ntid, tid;\n"
    "  cvt.rn.f32.u32 a0, gid;\n  add.f32 a1, a0, 0f3F800000;\n  add.f32 a2, a0, 0f40000000;\n"
    "  add.f32 a3, a0, 0f40400000;\n  mov.f32 b, 0f3F7FFFFE;\n  mov.f32 c, 0f3A83126F;\n"
    "  mov.u64 i, 0;\n"
    "LOOP:\n  setp.ge.u64 p, i, n;\n  @p bra DONE;\n"
    "  fma.rn.f32 a0, a0, b, c;\n  fma.rn.f32 a1, a1, b, c;\n  fma.rn.f32 a2, a2, b, c;\n"
    "  fma.rn.f32 a3, a3, b, c;\n  add.u64 i, i, 1;\n  bra LOOP;\n"
    "DONE:\n  add.f32 a0, a0, a1;\n  add.f32 a2, a2, a3;\n  add.f32 a0, a0, a2;\n"
    "  mul.wide.u32 off, gid, 4;\n  add.u64 addr, addr, off;\n  st.global.f32 [addr], a0;\n"
    "  @!timed bra.uni EXIT;\n  bar.sync 0;\n"   /* the block's end: its last thread is done */
    "  @lead mov.u64 t, %globaltimer;\n  @lead red.global.max.u64 [slot+8], t;\n"
    "EXIT:\n  ret;\n}\n";

#define BLOCK 256
#define BLOCKS_PER_SM 4
#define ATTR_SM_COUNT 16   /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
#define MAX_STEPS 1000000           /* steps recorded (each one's start, issue, end, latency) */
#define MAX_IDLE 4096               /* --duty's idle phases recorded */
#define MAX_TIMED_LAUNCHES 65536   /* 1 MiB of slots; a 3 s compute-bound job launches ~3000 */

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*attribute)(int *, int, CUdevice);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*load)(CUmodule *, const void *);
    CUresult (*function)(CUfunction *, CUmodule, const char *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*copy_in)(CUdeviceptr, const void *, size_t);
    CUresult (*copy_out)(void *, CUdeviceptr, size_t);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*sync)(void);
} cu;
static CUfunction kernel;
static CUdeviceptr out;
static unsigned grid;

struct kernel_time { unsigned long long start, end; };   /* a slot of the kernel's times parameter */
static CUdeviceptr timed_slots;
static struct kernel_time *kernel_times;
static long timed_slot_count;

static void die(const char *what, CUresult rc)
{
    fprintf(stderr, "burst: %s failed (CUDA error %d)\n", what, rc);
    exit(1);
}
#define CHECK(call, what) do { CUresult rc_ = (call); if (rc_ != CUDA_SUCCESS) die(what, rc_); } while (0)

static double now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now_epoch(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void *sym(void *h, const char *name)
{
    void *fn = dlsym(h, name);
    if (!fn) {
        fprintf(stderr, "burst: libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return fn;
}

/* When each start-up phase ended (epoch seconds): where one job's start-up waited for another's. */
static const char *const PHASES[] = {"init", "context", "module", "alloc", "slots", "warm"};
enum { N_PHASES = sizeof PHASES / sizeof PHASES[0] };
static double phase_end[N_PHASES];

static void setup(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "burst: %s\n", dlerror());
        exit(1);
    }
    cu.init = sym(h, "cuInit");
    cu.device_get = sym(h, "cuDeviceGet");
    cu.attribute = sym(h, "cuDeviceGetAttribute");
    cu.retain = sym(h, "cuDevicePrimaryCtxRetain");
    cu.set_current = sym(h, "cuCtxSetCurrent");
    cu.load = sym(h, "cuModuleLoadData");
    cu.function = sym(h, "cuModuleGetFunction");
    cu.alloc = sym(h, "cuMemAlloc_v2");
    cu.copy_in = sym(h, "cuMemcpyHtoD_v2");
    cu.copy_out = sym(h, "cuMemcpyDtoH_v2");
    cu.launch = sym(h, "cuLaunchKernel");
    cu.sync = sym(h, "cuCtxSynchronize");
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    int sms = 0;
    CHECK(cu.init(0), "cuInit");
    phase_end[0] = now_epoch();
    CHECK(cu.device_get(&dev, 0), "cuDeviceGet");
    CHECK(cu.retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(cu.set_current(ctx), "cuCtxSetCurrent");
    phase_end[1] = now_epoch();
    if (cu.attribute(&sms, ATTR_SM_COUNT, dev) != CUDA_SUCCESS || sms <= 0)
        sms = 1;
    grid = (unsigned)sms * BLOCKS_PER_SM;
    CHECK(cu.load(&mod, PTX), "cuModuleLoadData");
    CHECK(cu.function(&kernel, mod, "sleep"), "cuModuleGetFunction");
    phase_end[2] = now_epoch();
    CHECK(cu.alloc(&out, (size_t)grid * BLOCK * sizeof(float)), "cuMemAlloc");
    phase_end[3] = now_epoch();
}

/* Slots for the first `launches` measured launches, each {UINT64_MAX, 0}: what min and max fold into. */
static void setup_kernel_times(long launches)
{
    timed_slot_count = launches < MAX_TIMED_LAUNCHES ? launches : MAX_TIMED_LAUNCHES;
    size_t bytes = sizeof(struct kernel_time) * (size_t)timed_slot_count;
    kernel_times = malloc(bytes);
    if (!kernel_times) {
        fprintf(stderr, "burst: no memory for %ld kernel times\n", timed_slot_count);
        exit(1);
    }
    for (long i = 0; i < timed_slot_count; i++)
        kernel_times[i] = (struct kernel_time){~0ull, 0};
    CHECK(cu.alloc(&timed_slots, bytes), "cuMemAlloc (kernel times)");
    CHECK(cu.copy_in(timed_slots, kernel_times, bytes), "cuMemcpyHtoD (kernel times)");
}

/* slot: the measured launch's index, or -1 (warm-up, calibration): not recorded. */
static void launch(unsigned long long iters, long slot)
{
    CUdeviceptr times = 0;
    if (slot >= 0 && slot < timed_slot_count)
        times = timed_slots + (CUdeviceptr)slot * sizeof(struct kernel_time);
    void *params[] = {&iters, &out, &times};
    CHECK(cu.launch(kernel, grid, 1, 1, BLOCK, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
}

/* Iterations per millisecond: the median of a few timed kernels, after growing one to ~kernel_ms. */
static double calibrate(double kernel_ms)
{
    unsigned long long iters = 1000;
    double ms = 0;
    for (int tries = 0; tries < 30; tries++) {
        double t0 = now_mono();
        launch(iters, -1);
        CHECK(cu.sync(), "cuCtxSynchronize");
        ms = (now_mono() - t0) * 1000;
        if (ms >= kernel_ms * 0.8)
            break;
        iters = (unsigned long long)(iters * (ms > 0.05 ? fmin(8.0, kernel_ms / ms) : 8.0)) + 1;
    }
    for (int k = 0; k < 100; k++)  /* ~0.1 s of work first: the clocks settle before the timing */
        launch(iters, -1);
    CHECK(cu.sync(), "cuCtxSynchronize");
    double best[5];
    for (int r = 0; r < 5; r++) {  /* 10 kernels back to back: launch gaps stay out of the rate */
        double t0 = now_mono();
        for (int k = 0; k < 10; k++)
            launch(iters, -1);
        CHECK(cu.sync(), "cuCtxSynchronize");
        best[r] = iters * 10 / ((now_mono() - t0) * 1000);
    }
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (best[j] < best[i]) { double t = best[i]; best[i] = best[j]; best[j] = t; }
    return best[2];
}

/* Each recorded kernel's [start_ns, end_ns]; a slot still at its initial values was not run as
 * PTX (the fake driver runs none) and counts as unrecorded, as do launches past the slots. */
static void print_kernel_times(long launches)
{
    size_t bytes = sizeof(struct kernel_time) * (size_t)timed_slot_count;
    CHECK(cu.copy_out(kernel_times, timed_slots, bytes), "cuMemcpyDtoH (kernel times)");
    long shown = 0;
    printf(", \"gpu_kernels\": [");
    for (long i = 0; i < launches && i < timed_slot_count; i++) {
        struct kernel_time t = kernel_times[i];
        if (t.start == ~0ull || t.end == 0)
            continue;
        printf("%s[%llu, %llu]", shown ? ", " : "", t.start, t.end);
        shown++;
    }
    printf("], \"gpu_kernels_unrecorded\": %ld", launches - shown);
}

static double arg_num(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "burst: %s needs a value\n", argv[*i]);
        exit(2);
    }
    char *end;
    double v = strtod(argv[++*i], &end);
    if (*end || v < 0 || v != v) {
        fprintf(stderr, "burst: %s: not a non-negative number: %s\n", argv[*i - 1], argv[*i]);
        exit(2);
    }
    return v;
}

/* --mem-mib's check: a 1 MiB sample every 64 MiB of the ballast, written (check 0) with a pattern of
 * the seed and the offset, or read back and compared (check 1): the samples that differ. */
#define SAMPLE_BYTES (1u << 20)
#define SAMPLE_EVERY (64ull << 20)
static long mem_samples(CUdeviceptr base, size_t bytes, unsigned seed, int check)
{
    static uint32_t want[SAMPLE_BYTES / 4], got[SAMPLE_BYTES / 4];
    long bad = 0;
    for (size_t off = 0; off + SAMPLE_BYTES <= bytes; off += SAMPLE_EVERY) {
        uint32_t x = seed * 2654435761u ^ (uint32_t)(off >> 20);
        for (size_t i = 0; i < SAMPLE_BYTES / 4; i++) {
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            want[i] = x;
        }
        if (!check) {
            CHECK(cu.copy_in(base + off, want, SAMPLE_BYTES), "cuMemcpyHtoD (--mem-mib sample)");
            continue;
        }
        CHECK(cu.copy_out(got, base + off, SAMPLE_BYTES), "cuMemcpyDtoH (--mem-mib sample)");
        bad += memcmp(want, got, SAMPLE_BYTES) != 0;
    }
    return bad;
}

int main(int argc, char **argv)
{
    double ipm = 0, gpu_ms = 0, kernel_ms = 1, host_ms = -1, host_ratio = -1, seconds = 0, delay = 0;
    double start_at = 0, poisson_ms = 0, seed = 1, mem_mib = 0, duty_run = 0, duty_idle = 0;
    long steps = 0;
    int do_calibrate = 0, gpu_times = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calibrate")) do_calibrate = 1;
        else if (!strcmp(argv[i], "--ipm")) ipm = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--gpu-ms")) gpu_ms = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--kernel-ms")) kernel_ms = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--host-ms")) host_ms = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--host-ratio")) host_ratio = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--steps")) steps = (long)arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--seconds")) seconds = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--start-delay")) delay = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--start-at")) start_at = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--gpu-times")) gpu_times = 1;
        else if (!strcmp(argv[i], "--poisson-ms")) poisson_ms = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--seed")) seed = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--mem-mib")) mem_mib = arg_num(argc, argv, &i);
        else if (!strcmp(argv[i], "--duty")) {
            char end = 0;
            if (i + 1 >= argc || sscanf(argv[++i], "%lf:%lf%c", &duty_run, &duty_idle, &end) != 2
                || !(duty_run > 0) || !(duty_idle > 0)) {
                fprintf(stderr, "burst: --duty needs RUN:IDLE, two positive numbers of seconds\n");
                return 2;
            }
        }
        else {
            fprintf(stderr, "burst: unknown argument %s (see the comment at the top of burst.c)\n", argv[i]);
            return 2;
        }
    }
    if (kernel_ms <= 0) {
        fprintf(stderr, "burst: --kernel-ms must be above 0\n");
        return 2;
    }
    if (!do_calibrate && (ipm <= 0 || gpu_ms <= 0 || (host_ms < 0) == (host_ratio < 0)
                          || (steps <= 0) == (seconds <= 0))) {
        fprintf(stderr, "burst: needs --ipm, --gpu-ms, one of --host-ms/--host-ratio and one of "
                        "--steps/--seconds (or --calibrate)\n");
        return 2;
    }
    double t_start = now_epoch();
    setup();
    if (do_calibrate) {
        double setup_s = now_epoch() - t_start;   /* context, module, buffer: what every job pays */
        double rate = calibrate(kernel_ms);
        printf("{\"ipm\": %.3f, \"grid\": %u, \"block\": %d, \"startup_s\": %.4f}\n", rate, grid, BLOCK,
               setup_s);
        return 0;
    }
    /* A burst is k kernels of about gpu_ms / k each, k = gpu_ms / kernel_ms rounded (at least 1). */
    long k = lround(gpu_ms / kernel_ms);
    if (k < 1)
        k = 1;
    unsigned long long iters = (unsigned long long)llround(ipm * gpu_ms / k);
    if (iters < 1)
        iters = 1;
    if (gpu_times)
        setup_kernel_times(steps > 0 ? steps * k : MAX_TIMED_LAUNCHES);
    CUdeviceptr ballast = 0;
    size_t ballast_bytes = (size_t)(mem_mib * 1048576.0);
    if (mem_mib > 0) {
        CHECK(cu.alloc(&ballast, ballast_bytes), "cuMemAlloc (--mem-mib)");
        mem_samples(ballast, ballast_bytes, (unsigned)seed, 0);
    }
    srand48((long)seed);
    phase_end[4] = now_epoch();
    launch(iters, -1);  /* warm-up: the module's first launch, outside the measured steps */
    CHECK(cu.sync(), "cuCtxSynchronize");
    phase_end[5] = now_epoch();
    double startup = now_epoch() - t_start;
    sleep_s(delay);
    double late_ms = 0;
    if (start_at > 0) {
        double wait = start_at - now_epoch();
        if (wait > 0)
            sleep_s(wait);
        else
            late_ms = -wait * 1000;
    }
    long cap = steps > 0 ? steps : 10000000;
    size_t slots = sizeof(double) * (size_t)(cap < MAX_STEPS ? cap : MAX_STEPS);
    double *starts = malloc(slots), *ends = malloc(slots), *issued = malloc(slots), *lat = malloc(slots);
    if (!starts || !ends || !issued || !lat)
        return 1;
    double t_end = now_mono() + seconds;
    long n = 0, n_idle = 0;
    double idle[MAX_IDLE][2], phase_from = now_mono();   /* --duty: the idle phases, this phase's start */
    double arrival = now_mono();        /* --poisson-ms: the next request's arrival */
    while (n < cap && n < MAX_STEPS && (steps > 0 || now_mono() < t_end)) {
        if (poisson_ms > 0) {
            arrival += -log(1.0 - drand48()) * poisson_ms / 1000;
            if (arrival > now_mono())
                sleep_s(arrival - now_mono());
        }
        double m0 = now_mono();
        starts[n] = now_epoch();
        for (long j = 0; j < k; j++)
            launch(iters, n * k + j);
        issued[n] = starts[n] + (now_mono() - m0);
        CHECK(cu.sync(), "cuCtxSynchronize");
        double wall = now_mono() - m0;
        ends[n] = starts[n] + wall;
        lat[n] = poisson_ms > 0 ? now_mono() - arrival : wall;
        n++;
        if (poisson_ms <= 0)
            sleep_s(host_ratio >= 0 ? wall * host_ratio : host_ms / 1000);
        if (duty_run > 0 && now_mono() - phase_from >= duty_run && n_idle < MAX_IDLE) {
            idle[n_idle][0] = now_epoch();   /* the step's synchronise returned: nothing is queued */
            sleep_s(duty_idle);
            idle[n_idle][1] = now_epoch();
            n_idle++;
            phase_from = now_mono();
        }
    }
    printf("{\"startup_s\": %.4f, \"start\": %.6f, ", startup, t_start);
    if (start_at > 0)
        printf("\"start_at_late_ms\": %.3f, ", late_ms);
    printf("\"phase_ends\": {");
    for (int i = 0; i < N_PHASES; i++)
        printf("%s\"%s\": %.6f", i ? ", " : "", PHASES[i], phase_end[i]);
    printf("}, \"kernels_per_step\": %ld, \"iters\": %llu, \"step_starts\": [", k, iters);
    for (long i = 0; i < n; i++)
        printf("%s%.6f", i ? ", " : "", starts[i]);
    printf("], \"times\": [");
    for (long i = 0; i < n; i++)
        printf("%s%.6f", i ? ", " : "", ends[i]);
    printf("], \"issued\": [");
    for (long i = 0; i < n; i++)
        printf("%s%.6f", i ? ", " : "", issued[i]);
    printf("], \"latencies_ms\": [");
    for (long i = 0; i < n; i++)
        printf("%s%.3f", i ? ", " : "", lat[i] * 1000);
    printf("], \"idle\": [");
    for (long i = 0; i < n_idle; i++)
        printf("%s[%.6f, %.6f]", i ? ", " : "", idle[i][0], idle[i][1]);
    printf("]");
    if (ballast) {
        long bad = mem_samples(ballast, ballast_bytes, (unsigned)seed, 1);
        if (bad)
            printf(", \"mem_check\": \"bad %ld\"", bad);
        else
            printf(", \"mem_check\": \"ok\"");
    }
    if (gpu_times)
        print_kernel_times(n * k);
    printf("}\n");
    return 0;
}
