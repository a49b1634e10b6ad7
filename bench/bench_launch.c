/* bench_launch: what libnvshare.so adds to a kernel launch while the lock is held.
 *
 *   bench_launch [LAUNCHES] [HOOK_LIB] [ROUNDS]
 *
 * Runs itself 2 x ROUNDS times (default 5), without and with LD_PRELOAD=HOOK_LIB, interleaved and
 * with the order swapped every round, so that warm-up, clock and thermal drift fall on both sides
 * alike (a single "without, then with" run measured the hook as faster than no hook). Each run
 * warms up, then times LAUNCHES launches; the medians over the rounds and their ratio are printed,
 * and a last line `result {json}` for the benchmark harness. The kernel is a PTX
 * `.entry empty()` loaded with cuModuleLoadData, so the real driver runs it on any GPU of sm_50 or
 * newer; the fake driver of tests/c knows the name "empty" as a zero-length kernel. The driver is
 * reached with dlopen + dlsym, as most frameworks do, so no CUDA toolkit is needed to build this.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;

static const char empty_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry empty()\n"
    "{\n"
    "\tret;\n"
    "}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                              \
    do {                                                                                         \
        CUresult rc_ = (call);                                                                   \
        if (rc_ != 0) {                                                                          \
            fprintf(stderr, "bench_launch: %s failed: %d\n", #call, rc_);                        \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

static int measure(long launches)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "bench_launch: %s\n", dlerror());
        return 1;
    }
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))dlsym(h, "cuInit");
    CUresult (*device_get)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult (*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult (*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*load)(CUmodule *, const void *) = (CUresult (*)(CUmodule *, const void *))dlsym(h, "cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) =
        (CUresult (*)(CUfunction *, CUmodule, const char *))dlsym(h, "cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **) =
        (CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      CUstream, void **, void **))dlsym(h, "cuLaunchKernel");
    CUresult (*sync)(void) = (CUresult (*)(void))dlsym(h, "cuCtxSynchronize");
    if (!init || !device_get || !retain || !set_current || !load || !get_function || !launch || !sync) {
        fprintf(stderr, "bench_launch: libcuda.so.1 lacks a function this benchmark needs\n");
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(set_current(ctx));
    CHECK(load(&mod, empty_ptx));
    CHECK(get_function(&fn, mod, "empty"));
    for (int i = 0; i < 10000; i++)  /* warm up; with the hook this also takes the lock */
        CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(sync());
    double t0 = now_s();
    for (long i = 0; i < launches; i++)
        CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    double t1 = now_s();
    CHECK(sync());
    double t2 = now_s();
    printf("%.1f %.1f\n", (t1 - t0) * 1e9 / (double)launches, (t2 - t0) * 1e9 / (double)launches);
    return 0;
}

/* Runs this program once more with the given LD_PRELOAD (NULL: none); ns per launch, or < 0. */
static int child(const char *self, long launches, const char *preload, double *issue, double *total)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        if (preload)
            setenv("LD_PRELOAD", preload, 1);
        else
            unsetenv("LD_PRELOAD");
        setenv("BENCH_LAUNCH_CHILD", "1", 1);
        char n[32];
        snprintf(n, sizeof n, "%ld", launches);
        execl(self, self, n, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[128] = {0};
    size_t got = 0;
    ssize_t n;
    while (got < sizeof buf - 1 && (n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got == 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || sscanf(buf, "%lf %lf", issue, total) != 2)
        return -1;
    return 0;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *values, int n)
{
    double sorted[64];
    memcpy(sorted, values, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(double), by_value);
    return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

static void print_list(const char *name, const double *values, int n)
{
    printf("\"%s\": [", name);
    for (int i = 0; i < n; i++)
        printf("%s%.1f", i ? ", " : "", values[i]);
    printf("]");
}

int main(int argc, char **argv)
{
    long launches = argc > 1 ? atol(argv[1]) : 200000;
    if (getenv("BENCH_LAUNCH_CHILD"))
        return measure(launches);
    const char *hook = argc > 2 ? argv[2] : getenv("NVSHARE_LIB");
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    if (!hook || launches <= 0 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: bench_launch [LAUNCHES] HOOK_LIB [ROUNDS 1..64] (or NVSHARE_LIB=...)\n");
        return 2;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = '\0';
    double plain_issue[64], plain_total[64], hook_issue[64], hook_total[64], ratio[64];
    printf("round  without ns  with ns   ratio   (%ld empty-kernel launches each, lock held)\n", launches);
    for (int r = 0; r < rounds; r++) {
        /* ABBA...: the side that runs first alternates, so neither always gets the warmer machine. */
        int hook_first = r % 2;
        for (int k = 0; k < 2; k++) {
            int hooked = (k == 0) == hook_first;
            int rc = hooked ? child(self, launches, hook, &hook_issue[r], &hook_total[r])
                            : child(self, launches, NULL, &plain_issue[r], &plain_total[r]);
            if (rc != 0) {
                fprintf(stderr, "bench_launch: round %d %s the hook failed (see its message above)\n", r + 1,
                        hooked ? "with" : "without");
                return 1;
            }
        }
        ratio[r] = hook_issue[r] / plain_issue[r];
        printf("%5d  %10.1f  %8.1f  %6.3f   (%s first)\n", r + 1, plain_issue[r], hook_issue[r], ratio[r],
               hook_first ? "with" : "without");
    }
    double plain = median(plain_issue, rounds), hooked = median(hook_issue, rounds);
    printf("without the hook    %8.1f ns per launch (median of %d; %8.1f ns incl. completion)\n", plain, rounds,
           median(plain_total, rounds));
    printf("with libnvshare.so  %8.1f ns per launch (median of %d; %8.1f ns incl. completion)\n", hooked, rounds,
           median(hook_total, rounds));
    printf("overhead            %+8.1f ns per launch, ratio of medians %.3f, median of round ratios %.3f\n",
           hooked - plain, hooked / plain, median(ratio, rounds));
    printf("result {\"launches\": %ld, \"rounds\": %d, \"plain_ns\": %.1f, \"hook_ns\": %.1f, "
           "\"overhead_ns\": %.1f, \"ratio\": %.4f, \"median_round_ratio\": %.4f, ",
           launches, rounds, plain, hooked, hooked - plain, hooked / plain, median(ratio, rounds));
    print_list("plain_rounds_ns", plain_issue, rounds);
    printf(", ");
    print_list("hook_rounds_ns", hook_issue, rounds);
    printf("}\n");
    return 0;
}
