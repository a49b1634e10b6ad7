/* sockio.h: connecting to a Unix socket, and one recvmsg keeping the descriptors that come along
 * (sockio.c). */
#ifndef NVSHARE_SOCKIO_H
#define NVSHARE_SOCKIO_H

#include <sys/types.h>

/* One recvmsg (EINTR retried); descriptors that came along are appended to fds[*n_fds] (closed on
 * exec; those past max_fds are closed). Returns what recvmsg returned. */
#define NVSHARE_RECV_MAX_FDS 8
ssize_t nvshare_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *n_fds);
/* A connected Unix stream socket (closed on exec) to path, or -1 with errno set. */
int nvshare_connect_unix(const char *path);

#endif
