/* bench_launch: what libnvshare.so adds to a kernel launch while the lock is held.
 *
 *   bench_launch [LAUNCHES] [HOOK_LIB]
 *
 * Runs itself twice, without and with LD_PRELOAD=HOOK_LIB (same binary, same driver, same run), and
 * prints ns per cuLaunchKernel of an empty kernel for each and their ratio. The kernel is a PTX
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
    pid_t pid = fork();
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
    ssize_t got = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || sscanf(buf, "%lf %lf", issue, total) != 2)
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    long launches = argc > 1 ? atol(argv[1]) : 1000000;
    if (getenv("BENCH_LAUNCH_CHILD"))
        return measure(launches);
    const char *hook = argc > 2 ? argv[2] : getenv("NVSHARE_LIB");
    if (!hook) {
        fprintf(stderr, "usage: bench_launch [LAUNCHES] HOOK_LIB (or NVSHARE_LIB=...)\n");
        return 2;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = '\0';
    double plain_issue, plain_total, hook_issue, hook_total;
    if (child(self, launches, NULL, &plain_issue, &plain_total) != 0 ||
        child(self, launches, hook, &hook_issue, &hook_total) != 0) {
        fprintf(stderr, "bench_launch: a measurement failed (see its message above)\n");
        return 1;
    }
    printf("launches            %ld empty kernels, lock held\n", launches);
    printf("without the hook    %8.1f ns per launch (%8.1f ns incl. completion)\n", plain_issue, plain_total);
    printf("with libnvshare.so  %8.1f ns per launch (%8.1f ns incl. completion)\n", hook_issue, hook_total);
    printf("overhead            %+8.1f ns per launch, ratio %.3f\n", hook_issue - plain_issue,
           hook_issue / plain_issue);
    return 0;
}
