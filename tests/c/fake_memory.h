/* fake_memory.h: the fake driver's device memory shared between processes (FAKE_CUDA_SHARED_MEMORY),
 * included by fake_cuda.c (which takes and gives memory) and fake_nvml.c (which lists it, as NVML
 * lists a GPU's processes).
 *
 * The file holds each device's used bytes (the first MAX_DEV words, read by tests as before), then
 * one slot per (process, device) with what that process holds there. Like the real driver, memory
 * of a process that ended is released some time after it ends, not at once: the process chose its
 * delay from FAKE_CUDA_EXIT_RELEASE_MS ("N" or "A-B" for a random one in that range, default 0)
 * when it claimed its slot. Whoever looks at the memory next (an allocation that would not fit,
 * cuMemGetInfo, an NVML process list) reaps slots of dead processes: it stamps the first sighting
 * of the death, and once the delay has passed since then it gives the bytes back. A process killed
 * with SIGKILL is reaped the same way.
 */
#ifndef FAKE_MEMORY_H
#define FAKE_MEMORY_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_DEV 8
#define FAKE_SLOTS 256

struct fake_slot {
    int32_t pid;            /* 0 free, -1 being reaped */
    int32_t dev;
    uint64_t bytes;         /* what this process holds on dev */
    uint64_t dead_at_ns;    /* CLOCK_MONOTONIC of the first sighting of its death, 0 while alive */
    uint32_t delay_ms;      /* how long after that the driver releases its memory */
    uint32_t pad;
};

struct fake_memory {
    uint64_t used[FAKE_MAX_DEV];
    struct fake_slot slots[FAKE_SLOTS];
};

static inline uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A zombie (ended, not yet waited for) is dead here: the real driver releases a process's memory
 * when its files close at exit, not when its parent reaps it. */
static inline int fake_pid_alive(int32_t pid)
{
    if (kill(pid, 0) != 0 && errno != EPERM)
        return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return !(close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z');
}

/* Still held by a live process, or by a dead one whose release has not happened yet. */
static inline int fake_slot_held(struct fake_slot *s, uint64_t now)
{
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_SEQ_CST);
    if (pid <= 0)
        return 0;
    uint64_t dead = __atomic_load_n(&s->dead_at_ns, __ATOMIC_SEQ_CST);
    return !dead || now < dead + (uint64_t)s->delay_ms * 1000000ull;
}

/* Gives back the memory of processes that ended more than their delay ago. */
static inline void fake_reap(struct fake_memory *m)
{
    uint64_t now = fake_now_ns();
    for (int i = 0; i < FAKE_SLOTS; i++) {
        struct fake_slot *s = &m->slots[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_SEQ_CST);
        if (pid <= 0 || pid == (int32_t)getpid() || fake_pid_alive(pid))
            continue;
        uint64_t zero = 0;
        __atomic_compare_exchange_n(&s->dead_at_ns, &zero, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        if (fake_slot_held(s, now))
            continue;
        if (!__atomic_compare_exchange_n(&s->pid, &pid, -1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            continue;   /* another reaper won */
        uint64_t bytes = __atomic_exchange_n(&s->bytes, 0, __ATOMIC_SEQ_CST);
        if (s->dev >= 0 && s->dev < FAKE_MAX_DEV)
            __atomic_fetch_sub(&m->used[s->dev], bytes, __ATOMIC_SEQ_CST);
        __atomic_store_n(&s->dead_at_ns, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&s->pid, 0, __ATOMIC_SEQ_CST);
    }
}

static inline uint32_t fake_exit_delay_ms(void)
{
    const char *spec = getenv("FAKE_CUDA_EXIT_RELEASE_MS");
    if (!spec || !*spec)
        return 0;
    char *end;
    unsigned long lo = strtoul(spec, &end, 10), hi = lo;
    if (*end == '-')
        hi = strtoul(end + 1, NULL, 10);
    if (hi <= lo)
        return (uint32_t)lo;
    srand((unsigned)(getpid() ^ fake_now_ns()));
    return (uint32_t)(lo + (unsigned long)rand() % (hi - lo + 1));
}

/* This process's slot for dev, claimed on first use; NULL when all are taken (then nothing is
 * listed for it, and its memory is given back only by its own frees, as before slots). */
static inline struct fake_slot *fake_own_slot(struct fake_memory *m, int dev)
{
    int32_t me = (int32_t)getpid();
    for (int i = 0; i < FAKE_SLOTS; i++) {
        struct fake_slot *s = &m->slots[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_SEQ_CST) == me && s->dev == dev)
            return s;
    }
    for (int i = 0; i < FAKE_SLOTS; i++) {
        struct fake_slot *s = &m->slots[i];
        int32_t free_pid = 0;
        if (__atomic_compare_exchange_n(&s->pid, &free_pid, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            s->dev = dev;
            s->delay_ms = fake_exit_delay_ms();
            __atomic_store_n(&s->dead_at_ns, 0, __ATOMIC_SEQ_CST);
            __atomic_store_n(&s->bytes, 0, __ATOMIC_SEQ_CST);
            return s;
        }
    }
    return NULL;
}

#endif
