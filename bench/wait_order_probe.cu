// wait_order_probe.cu: when does the GPU look at a stream's wait (cuStreamWaitValue32) that follows a
// kernel still running in that stream: as its front end reaches it (the kernel after it then runs
// as soon as the one before ends, whatever the word says by then), or once the kernel before it has
// ended? csrc/hold.c holds a yielding job's queue with such waits; the answer says how much of that
// queue a prompt burst still meets (issue 42).
//
//   nvcc -O2 -arch=sm_90 -o /tmp/wait_order_probe bench/wait_order_probe.cu -lcuda
//   /tmp/wait_order_probe            (prints one line per case)
//
// Case A: K1 (spins 50 ms), wait(word == 0), K2. The word is 0 at launch, set to 1 10 ms later
// (K1 still running), back to 0 100 ms later. Case B: the same with the word set 1 before K1 ends
// but after the launch, K1 of 5 ms and the word set at 1 ms. Prints K2's start minus K1's end: about
// 0 when the wait was passed early, about the time the word stayed 1 after K1's end when not.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define DK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_; cuGetErrorString(r_, &s_); fprintf(stderr, "%s: %s\n", #x, s_); exit(1); } } while (0)

__global__ void spin_then_stamp(long long ns, unsigned long long *end)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
    *end = t;
}

__global__ void stamp(unsigned long long *at)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *at = t;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - (long)(ms / 1000) * 1000) * 1e6)};
    nanosleep(&ts, NULL);
}

int main(void)
{
    DK(cuInit(0));
    CUdevice dev; CUcontext ctx;
    DK(cuDeviceGet(&dev, 0));
    DK(cuDevicePrimaryCtxRetain(&ctx, dev));
    DK(cuCtxSetCurrent(ctx));
    CUstream s; DK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    volatile unsigned *word = (volatile unsigned *)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    DK(cuMemHostRegister((void *)word, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    CUdeviceptr dword; DK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    unsigned long long *t;   /* pinned host memory the kernels write (read after each case's synchronize) */
    DK(cuMemHostAlloc((void **)&t, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    struct { const char *name; double k1_ms, set_at_ms, hold_ms; int behind; } cases[] = {
        {"A: K1 50 ms, word 1 at 10 ms for 100 ms", 50, 10, 100, 1},
        {"B: K1 5 ms, word 1 at 1 ms for 20 ms", 5, 1, 20, 1},
        {"C: K1 5 ms, K1b 5 ms, wait, word 1 at 1 ms for 20 ms", 5, 1, 20, 2},
    };
    for (int r = 0; r < 3; r++)
    for (unsigned c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        *word = 0;
        memset((void *)t, 0, 64);
        for (int i = 0; i < cases[c].behind; i++)
            spin_then_stamp<<<1, 1, 0, s>>>((long long)(cases[c].k1_ms * 1e6), &t[0]);
        DK(cuStreamWaitValue32(s, dword, 0, CU_STREAM_WAIT_VALUE_EQ));
        stamp<<<1, 1, 0, s>>>(&t[1]);
        sleep_ms(cases[c].set_at_ms);
        *word = 1;
        __sync_synchronize();
        sleep_ms(cases[c].hold_ms);
        *word = 0;
        __sync_synchronize();
        DK(cuStreamSynchronize(s));
        printf("%s: K2 started %.3f ms after K1 ended (%s)\n", cases[c].name, ((long long)(t[1] - t[0])) / 1e6,
               (long long)(t[1] - t[0]) < 1000000 ? "the wait was passed while K1 ran" : "the wait was looked at after K1");
    }
    return 0;
}
