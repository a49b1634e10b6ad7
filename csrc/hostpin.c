/* hostpin.c: the pinned host memory that swap copies go to.
 *
 * A first swap-out is limited by pinning, not by the bus: on the H100 (bench/bench_pinning.py, 8 GiB
 * in 256 MiB chunks) cuMemHostAlloc then a copy ran at 2.2 GB/s, against 55 GB/s into memory pinned
 * before. Most of that is the kernel making and zeroing 4 KiB pages one fault at a time. Anonymous
 * memory asked for with MADV_HUGEPAGE (2 MiB pages, where transparent huge pages are "madvise" or
 * "always"), populated in one call (MADV_POPULATE_WRITE, Linux 5.14+) and then registered with
 * cuMemHostRegister ran at 6.4 GB/s the same way. So a buffer is made that way, and with
 * cuMemHostAlloc where the driver lacks cuMemHostRegister or refuses it. Either counts against the
 * job's memory cgroup in the same way (swap.c checks the room before it pins).
 *
 * Huge pages can also be slow: where the node's memory is fragmented, the kernel compacts it for
 * each one before the call returns (transparent_hugepage/defrag "madvise", the usual default). On a
 * busy CI machine 256 MiB took 260-880 ms that way, against about 100 ms in 4 KiB pages. So a huge
 * mapping slower than HUGE_SLOW_BYTES_PER_MS makes this process use 4 KiB pages from then on.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>

#include "driver.h"
#include "env.h"
#include "hostpin.h"

#define HUGE_BYTES ((size_t)2 << 20)
#define HUGE_SLOW_BYTES_PER_MS ((size_t)2 << 20)   /* 2 GB/s: slower than 4 KiB pages populated */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static size_t mapped_length(size_t size)
{
    return (size + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
}

static atomic_int huge_slow;    /* a huge mapping was slow here: 4 KiB pages from now on */
static atomic_int no_register;  /* the driver refused cuMemHostRegister once: cuMemHostAlloc from now on */

/* Anonymous memory of mapped_length(size) at a 2 MiB boundary, made (populated) at once, in huge pages
 * unless they proved slow in this process. */
static void *map_populated(size_t size)
{
    int huge = !atomic_load(&huge_slow);
    uint64_t started = nvshare_now_ns();
    size_t len = mapped_length(size), span = len + HUGE_BYTES;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len)
        munmap(p + len, (size_t)(raw + span - (p + len)));
    if (huge)
        (void)madvise(p, len, MADV_HUGEPAGE);     /* EINVAL without THP: 4 KiB pages, still correct */
    (void)madvise(p, len, MADV_POPULATE_WRITE);   /* EINVAL before 5.14: cuMemHostRegister makes them */
    double ms = (nvshare_now_ns() - started) / 1e6;
    if (huge && ms * HUGE_SLOW_BYTES_PER_MS > len && !atomic_exchange(&huge_slow, 1))
        nvshare_debug("host copies in huge pages: %zu bytes took %.1f ms (the kernel compacts memory for "
                      "them); 4 KiB pages from now on", len, ms);
    return p;
}

CUresult nvshare_host_pin(void **out, size_t size, int *mapped)
{
    const struct nvshare_real *r = &nvshare_real;
    *out = NULL;
    *mapped = 0;
    if (r->cuMemHostRegister_v2 && r->cuMemHostUnregister && !atomic_load(&no_register)) {
        void *p = map_populated(size);
        if (p) {
            CUresult rc = r->cuMemHostRegister_v2(p, mapped_length(size), 0);
            if (rc == CUDA_SUCCESS) {
                *out = p;
                *mapped = 1;
                return CUDA_SUCCESS;
            }
            munmap(p, mapped_length(size));
            if (!atomic_exchange(&no_register, 1))
                nvshare_debug("cuMemHostRegister of %zu bytes failed (CUDA error %d): cuMemHostAlloc instead "
                              "from now on", size, rc);
        }
    }
    return r->cuMemHostAlloc(out, size, 0);
}

void nvshare_host_unpin(void *p, size_t size, int mapped)
{
    if (!p)
        return;
    if (!mapped) {
        nvshare_real.cuMemFreeHost(p);
        return;
    }
    nvshare_real.cuMemHostUnregister(p);
    munmap(p, mapped_length(size));
}
