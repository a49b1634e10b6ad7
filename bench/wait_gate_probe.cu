// wait_gate_probe.cu: can a job's queued GPU work be held on the GPU itself while another job's
// request runs? (issue 42: a training that keeps a deep queue between requests and yet lets a
// request run alone.)
//
//   nvcc -O2 -o /tmp/wait_gate_probe bench/wait_gate_probe.cu -lcuda
//   /tmp/wait_gate_probe trainer FLAGFILE SECONDS GATE SEG      (prints kernels/s)
//   /tmp/wait_gate_probe server  FLAGFILE SECONDS GATE MEAN_MS REQ_KERNELS   (prints latencies)
//
// The trainer keeps about 20 ms of 100 us kernels (every SM busy) queued, as PyTorch does; with GATE
// it puts a cuStreamWaitValue32(flag == 0) before every SEG kernels, the flag being a word of a
// shared file that it maps and registers with the driver. The server serves requests of REQ_KERNELS
// 100 us one-block kernels at Poisson arrivals (mean MEAN_MS); with GATE it writes 1 into the flag
// as a request begins and 0 once it is done. What it tells: whether a stream that waits on a value
// gives the GPU over to the other context (the request then waits at most a segment) or keeps its
// time-slices (the request then runs at half speed, as co-located).
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define DK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_; cuGetErrorString(r_, &s_); fprintf(stderr, "%s: %s\n", #x, s_); exit(1); } } while (0)

__global__ void spin(long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile int *map_flag(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT, 0666);
    if (fd < 0 || ftruncate(fd, 4096) != 0) { perror(path); exit(1); }
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    return (volatile int *)p;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 6) { fprintf(stderr, "usage: see the header\n"); return 2; }
    const char *role = argv[1];
    volatile int *flag = map_flag(argv[2]);
    double seconds = atof(argv[3]);
    int gate = atoi(argv[4]);
    CK(cudaFree(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (!strcmp(role, "trainer")) {
        int seg = atoi(argv[5]);
        CUdeviceptr dflag = 0;
        if (gate) {
            DK(cuMemHostRegister((void *)flag, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
            DK(cuMemHostGetDevicePointer(&dflag, (void *)flag, 0));
        }
        enum { RING = 64 };
        cudaEvent_t ev[RING];
        for (int i = 0; i < RING; i++) CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
        long launched = 0, done = 0;
        int head = 0, n = 0;
        double t0 = now_s(), end = t0 + seconds;
        while (now_s() < end) {
            // about 20 ms queued: an event every 10 kernels, at most 20 events outstanding
            while (n >= 20) {
                CK(cudaEventSynchronize(ev[head]));
                head = (head + 1) % RING; n--; done += 10;
            }
            for (int k = 0; k < 10; k++) {
                if (gate && launched % seg == 0)
                    DK(cuStreamWaitValue32((CUstream)s, dflag, 0, CU_STREAM_WAIT_VALUE_EQ));
                spin<<<sms * 4, 128, 0, s>>>(100000);
                launched++;
            }
            CK(cudaEventRecord(ev[(head + n) % RING], s)); n++;
        }
        double t1 = now_s();
        while (n) { CK(cudaEventSynchronize(ev[head])); head = (head + 1) % RING; n--; done += 10; }
        printf("{\"role\":\"trainer\",\"gate\":%d,\"seg\":%d,\"kernels_per_s\":%.1f}\n", gate, seg,
               (done) / (now_s() - t0));
        (void)t1;
        return 0;
    }
    double mean_ms = atof(argv[5]);
    int reqk = argc > 6 ? atoi(argv[6]) : 20;
    srand48(7);
    enum { MAXN = 100000 };
    static double lat[MAXN];
    int nreq = 0;
    // warm-up
    for (int i = 0; i < 5; i++) { spin<<<1, 32, 0, s>>>(100000); }
    CK(cudaStreamSynchronize(s));
    double t = now_s(), end = t + seconds;
    while (t < end && nreq < MAXN) {
        t += -log(1 - drand48()) * mean_ms / 1e3;
        double w;
        while ((w = t - now_s()) > 0) { if (w > 0.0005) usleep((useconds_t)((w - 0.0003) * 1e6)); }
        double start = now_s() > t ? now_s() : t;
        (void)start;
        if (gate) { *flag = 1; __sync_synchronize(); }
        for (int k = 0; k < reqk; k++) spin<<<1, 32, 0, s>>>(100000);
        CK(cudaStreamSynchronize(s));
        if (gate) { __sync_synchronize(); *flag = 0; __sync_synchronize(); }
        lat[nreq++] = (now_s() - t) * 1e3;
    }
    *flag = 0;
    qsort(lat, nreq, sizeof lat[0], cmp);
    printf("{\"role\":\"server\",\"gate\":%d,\"n\":%d,\"p50_ms\":%.2f,\"p90_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f}\n",
           gate, nreq, lat[nreq / 2], lat[nreq * 9 / 10], lat[nreq * 99 / 100], lat[nreq - 1]);
    return 0;
}
