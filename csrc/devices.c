/* devices.c: GPU device files that Slurm's device cgroup keeps from this job (ConstrainDevices=yes).
 *
 * Slurm denies a job every GPU device file of gres.conf that its own GRES do not cover, and the
 * nvshare GRES covers none. The cgroup is asked only when a file is opened, so when an open of a
 * character device fails with EPERM, the hook asks nvshare-scheduler, which runs outside the job's
 * cgroup, to open the device file of a GPU the job was placed on and pass its descriptor back
 * (DEVICE_OPEN, SCM_RIGHTS). The driver (libcuda, NVML) opens /dev/nvidia<minor> through open(),
 * open64(), openat() or fopen(); each is interposed here and changes nothing unless the open was
 * denied. Any other answer keeps the real function's: EPERM, and one line on stderr saying why.
 *
 * Each request is its own short connection, so a driver opening files inside cuInit never waits on
 * the gate's connection, and a process that never calls cuInit (nvidia-smi) is served the same.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"
#include "env.h"
#include "outbox.h"
#include "sockio.h"

/* How long one request may wait for the daemon (a restarting daemon rebuilds its jobs first), and
 * for how long after a daemon that cannot be reached later requests fail at once: the driver opens
 * its device files a dozen times in cuInit, and none of them should wait the whole time again. */
#define DEVICE_ANSWER_MS 10000
#define UNREACHABLE_QUIET_NS 2000000000ull

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef FILE *(*fopen_fn)(const char *, const char *);

#if defined(__x86_64__)
#define V_OPEN "GLIBC_2.2.5"
#define V_OPENAT "GLIBC_2.4"
#define V_CHK "GLIBC_2.7"
#elif defined(__aarch64__)
#define V_OPEN "GLIBC_2.17"
#define V_OPENAT "GLIBC_2.17"
#define V_CHK "GLIBC_2.17"
#endif

static void *real_symbol(const char *name, const char *version)
{
    void *fn = NULL;
#ifdef V_OPEN
    fn = dlvsym(RTLD_NEXT, name, version);
#else
    (void)version;
#endif
    return fn ? fn : dlsym(RTLD_NEXT, name);
}

#define REAL(type, name, version)                                              \
    static type real_##name(void)                                               \
    {                                                                           \
        static type fn;                                                         \
        type f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);                        \
        if (!f) {                                                               \
            f = (type)real_symbol(#name, version);                              \
            __atomic_store_n(&fn, f, __ATOMIC_RELEASE);                         \
        }                                                                       \
        return f;                                                               \
    }
#ifndef V_OPEN
#define V_OPEN NULL
#define V_OPENAT NULL
#define V_CHK NULL
#endif
REAL(open_fn, open, V_OPEN)
REAL(open_fn, open64, V_OPEN)
REAL(openat_fn, openat, V_OPENAT)
REAL(openat_fn, openat64, V_OPENAT)
REAL(fopen_fn, fopen, V_OPEN)
REAL(fopen_fn, fopen64, V_OPEN)

static _Atomic uint64_t unreachable_until_ns;
static atomic_int refusals_said;

/* Reads one frame (header and a REPLY) before the deadline, keeping a descriptor that comes along. */
static int read_reply(int sock, uint64_t deadline, struct nvshare_reply *rep, int *passed)
{
    struct { struct nvshare_hdr hdr; struct nvshare_reply body; } frame;
    char *p = (char *)&frame;
    size_t want = sizeof frame;
    while (want) {
        uint64_t now = nvshare_now_ns();
        if (now >= deadline)
            return -1;
        struct pollfd pfd = {sock, POLLIN, 0};
        int ready = poll(&pfd, 1, (int)((deadline - now) / 1000000u) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            return -1;
        int got[NVSHARE_RECV_MAX_FDS], n_got = 0;
        ssize_t n = nvshare_recv_fds(sock, p, want, got, NVSHARE_RECV_MAX_FDS, &n_got);
        for (int i = 0; i < n_got; i++) {
            if (*passed < 0)
                *passed = got[i];
            else
                close(got[i]);
        }
        if (n <= 0)
            return -1;
        p += n;
        want -= (size_t)n;
        /* A frame other than a REPLY of our size: the daemon refused the request itself. */
        if ((size_t)(p - (char *)&frame) >= sizeof frame.hdr &&
            (frame.hdr.magic != NVSHARE_MAGIC || frame.hdr.type != NVSHARE_MSG_REPLY ||
             frame.hdr.length != sizeof frame.body))
            return -1;
    }
    *rep = frame.body;
    rep->message[sizeof rep->message - 1] = '\0';
    return 0;
}

/* The daemon's descriptor of the device, or -1 with why in `why`. */
static int ask_daemon(dev_t rdev, int flags, char *why, size_t why_len)
{
    uint64_t now = nvshare_now_ns();
    if (now < atomic_load(&unreachable_until_ns)) {
        snprintf(why, why_len, "nvshare-scheduler at %s cannot be reached", nvshare_cfg.socket_path);
        return -1;
    }
    uint64_t deadline = now + DEVICE_ANSWER_MS * 1000000ull;
    int sock;
    while ((sock = nvshare_connect_unix(nvshare_cfg.socket_path)) < 0) {
        int err = errno;
        if (nvshare_now_ns() + 100000000ull >= deadline || (err != ENOENT && err != ECONNREFUSED &&
                                                          err != EAGAIN && err != EINTR)) {
            atomic_store(&unreachable_until_ns, nvshare_now_ns() + UNREACHABLE_QUIET_NS);
            snprintf(why, why_len, "cannot reach nvshare-scheduler at %s (%s)", nvshare_cfg.socket_path,
                     strerror(err));
            return -1;
        }
        struct timespec pause = {0, 100000000L};
        nanosleep(&pause, NULL);
    }
    struct { struct nvshare_hdr hdr; struct nvshare_device_open body; } frame;
    memset(&frame, 0, sizeof frame);
    nvshare_fill_header(&frame.hdr, NVSHARE_MSG_DEVICE_OPEN, sizeof frame.body);
    frame.body.job_id = nvshare_cfg.job_id;
    frame.body.step_id = nvshare_cfg.step_id;
    frame.body.dev_major = major(rdev);
    frame.body.dev_minor = minor(rdev);
    frame.body.access = (uint32_t)(flags & O_ACCMODE);
    int passed = -1;
    struct nvshare_reply rep;
    if (send(sock, &frame, sizeof frame, MSG_NOSIGNAL) != (ssize_t)sizeof frame ||
        read_reply(sock, deadline, &rep, &passed) != 0) {
        close(sock);
        if (passed >= 0)
            close(passed);
        snprintf(why, why_len, "nvshare-scheduler gave no answer");
        return -1;
    }
    close(sock);
    if (rep.status != NVSHARE_OK || passed < 0) {
        if (passed >= 0)
            close(passed);
        snprintf(why, why_len, "nvshare-scheduler refused (status %d: %s)", rep.status,
                 rep.status == NVSHARE_OK ? "no descriptor came" : rep.message);
        return -1;
    }
    return passed;
}

/* A GPU's device file is named nvidia<minor> (/dev/nvidia0): other denied devices are none of
 * the daemon's business, and must not wait for it. */
static int gpu_device_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "nvidia", 6) != 0 || !base[6])
        return 0;
    for (const char *p = base + 6; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

/* After a real open failed with EPERM: the daemon's descriptor of a GPU's device file, with the
 * caller's O_CLOEXEC and O_NONBLOCK, or -1 with errno EPERM as the real open left it. */
static int denied_device(int dirfd, const char *path, int flags)
{
    if (!nvshare_cfg.active || nvshare_in_hook || !path || !gpu_device_name(path))
        goto keep;
    struct stat st;
    if (fstatat(dirfd, path, &st, 0) != 0 || !S_ISCHR(st.st_mode))
        goto keep;
    char why[NVSHARE_TEXT_LEN + 96];
    int fd = ask_daemon(st.st_rdev, flags, why, sizeof why);
    if (fd < 0) {
        if (atomic_fetch_add(&refusals_said, 1) < 4)
            nvshare_log("%s: this job's device cgroup denies it, and %s", path, why);
        goto keep;
    }
    if (!(flags & O_CLOEXEC))
        fcntl(fd, F_SETFD, 0);
    if (flags & O_NONBLOCK)
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    nvshare_debug("%s: opened by nvshare-scheduler (the job's device cgroup denies it)", path);
    return fd;
keep:
    errno = EPERM;
    return -1;
}

static int wants_mode(int flags)
{
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE)
        return 1;
#endif
    return (flags & O_CREAT) != 0;
}

#define MODE_ARG(flags, mode)                  \
    mode_t mode = 0;                           \
    if (wants_mode(flags)) {                   \
        va_list ap;                            \
        va_start(ap, flags);                   \
        mode = (mode_t)va_arg(ap, unsigned);   \
        va_end(ap);                            \
    }

NVSHARE_EXPORT int nvshare_open(const char *path, int flags, ...)
{
    MODE_ARG(flags, mode)
    int fd = real_open()(path, flags, mode);
    return fd >= 0 || errno != EPERM ? fd : denied_device(AT_FDCWD, path, flags);
}

NVSHARE_EXPORT int nvshare_open64(const char *path, int flags, ...)
{
    MODE_ARG(flags, mode)
    int fd = real_open64()(path, flags, mode);
    return fd >= 0 || errno != EPERM ? fd : denied_device(AT_FDCWD, path, flags);
}

NVSHARE_EXPORT int nvshare_openat(int dirfd, const char *path, int flags, ...)
{
    MODE_ARG(flags, mode)
    int fd = real_openat()(dirfd, path, flags, mode);
    return fd >= 0 || errno != EPERM ? fd : denied_device(dirfd, path, flags);
}

NVSHARE_EXPORT int nvshare_openat64(int dirfd, const char *path, int flags, ...)
{
    MODE_ARG(flags, mode)
    int fd = real_openat64()(dirfd, path, flags, mode);
    return fd >= 0 || errno != EPERM ? fd : denied_device(dirfd, path, flags);
}

/* The _FORTIFY_SOURCE entry points: no mode (they refuse O_CREAT without one). */
NVSHARE_EXPORT int nvshare_open_2(const char *path, int flags) { return nvshare_open(path, flags); }
NVSHARE_EXPORT int nvshare_open64_2(const char *path, int flags) { return nvshare_open64(path, flags); }
NVSHARE_EXPORT int nvshare_openat_2(int dirfd, const char *path, int flags)
{
    return nvshare_openat(dirfd, path, flags);
}
NVSHARE_EXPORT int nvshare_openat64_2(int dirfd, const char *path, int flags)
{
    return nvshare_openat64(dirfd, path, flags);
}

static int fopen_flags(const char *mode)
{
    int flags = O_RDONLY;
    if (mode && (*mode == 'w' || *mode == 'a'))
        flags = O_WRONLY;
    for (const char *m = mode; m && *m && *m != ','; m++) {
        if (*m == '+')
            flags = (flags & ~O_ACCMODE) | O_RDWR;
        else if (*m == 'e')
            flags |= O_CLOEXEC;
    }
    return flags;
}

static FILE *denied_stream(FILE *real, const char *path, const char *mode)
{
    if (real || errno != EPERM)
        return real;
    int fd = denied_device(AT_FDCWD, path, fopen_flags(mode));
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
    return f;
}

NVSHARE_EXPORT FILE *nvshare_fopen(const char *path, const char *mode)
{
    return denied_stream(real_fopen()(path, mode), path, mode);
}

NVSHARE_EXPORT FILE *nvshare_fopen64(const char *path, const char *mode)
{
    return denied_stream(real_fopen64()(path, mode), path, mode);
}

/* Exported under the C library's own versions, which the driver's references name. */
#if defined(__x86_64__)
__asm__(".symver nvshare_open, open@@GLIBC_2.2.5");
__asm__(".symver nvshare_open64, open64@@GLIBC_2.2.5");
__asm__(".symver nvshare_openat, openat@@GLIBC_2.4");
__asm__(".symver nvshare_openat64, openat64@@GLIBC_2.4");
__asm__(".symver nvshare_open_2, __open_2@@GLIBC_2.7");
__asm__(".symver nvshare_open64_2, __open64_2@@GLIBC_2.7");
__asm__(".symver nvshare_openat_2, __openat_2@@GLIBC_2.7");
__asm__(".symver nvshare_openat64_2, __openat64_2@@GLIBC_2.7");
__asm__(".symver nvshare_fopen, fopen@@GLIBC_2.2.5");
__asm__(".symver nvshare_fopen64, fopen64@@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver nvshare_open, open@@GLIBC_2.17");
__asm__(".symver nvshare_open64, open64@@GLIBC_2.17");
__asm__(".symver nvshare_openat, openat@@GLIBC_2.17");
__asm__(".symver nvshare_openat64, openat64@@GLIBC_2.17");
__asm__(".symver nvshare_open_2, __open_2@@GLIBC_2.17");
__asm__(".symver nvshare_open64_2, __open64_2@@GLIBC_2.17");
__asm__(".symver nvshare_openat_2, __openat_2@@GLIBC_2.17");
__asm__(".symver nvshare_openat64_2, __openat64_2@@GLIBC_2.17");
__asm__(".symver nvshare_fopen, fopen@@GLIBC_2.17");
__asm__(".symver nvshare_fopen64, fopen64@@GLIBC_2.17");
#endif
