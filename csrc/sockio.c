/* sockio.c: reading from a Unix socket with the descriptors that come along (SCM_RIGHTS).
 *
 * The daemon passes descriptors with some frames (BURST_PAGE, HANDOFF, a DEVICE_OPEN reply); both
 * the connection's reader (client.c) and devices.c's one-shot requests read through here. Calls
 * nothing of the hook's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sockio.h"

ssize_t nvshare_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *n_fds)
{
    union {
        char buf[CMSG_SPACE(NVSHARE_RECV_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {buf, len};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    int saved = errno;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (*n_fds < max_fds)
                fds[(*n_fds)++] = fd;
            else
                close(fd);
        }
    }
    errno = saved;
    return n;
}

int nvshare_connect_unix(const char *path)
{
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    size_t n = strnlen(path, sizeof addr.sun_path);
    if (n >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(addr.sun_path, path, n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}
