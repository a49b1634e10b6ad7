/* client.c: this process's one connection to nvshare-scheduler.
 *
 * A thread started lazily (cuInit or the first gated call) connects, sends CLIENT_REGISTER and then
 * reads daemon messages for the life of the process; a writer thread sends what the outbox holds.
 * The daemon is *gone* only when a connect finds nobody listening on its socket; then gated work
 * waits (NVSHARE_ON_DAEMON_LOSS=wait) or passes (run), and the thread retries with backoff up to
 * ~1 s. A daemon that keeps the connection open but answers late (a registration, a heartbeat, a
 * question past NVSHARE_DAEMON_TIMEOUT_MS) is busy, not gone: logged once, waited for, gated. A
 * connection the daemon closes is reconnected at once; only a failed reconnect makes it gone. The
 * reader only decodes: answers go to the outbox, everything else to the handlers the top layer
 * registered (events.c), so this file calls nothing above it. After a reconnect they report memory
 * again and waiting threads ask again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "driver.h"
#include "env.h"
#include "outbox.h"
#include "sockio.h"

/* How often the reader looks at the link while nothing arrives, and when it asks whether the daemon
 * is still there: a daemon that answers no heartbeat for NVSHARE_DAEMON_TIMEOUT_MS is treated as lost. */
#define READER_TICK_MS 200
#define HEARTBEAT_AFTER_QUIET_NS 1000000000ull
/* CLIENT_REGISTER answered NOJOB: a restarted daemon may still be rebuilding its jobs from Slurm. */
#define NOJOB_RETRY_NS 8000000000ull
#define NOJOB_RETRY_PAUSE_MS 100
#define RECONNECT_BACKOFF_MAX_MS 1000
#define THREAD_STACK_BYTES (256 * 1024)

static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;
static int started;
static const struct nvshare_link_events *_Atomic handlers;

void nvshare_client_set_events(const struct nvshare_link_events *events) { atomic_store(&handlers, events); }

static const struct nvshare_link_events *events(void)
{
    static const struct nvshare_link_events none;
    const struct nvshare_link_events *h = atomic_load(&handlers);
    return h ? h : &none;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Descriptors that came with the daemon's frames (SCM_RIGHTS: BURST_PAGE and HANDOFF carry one), in
 * order, until the frame they came with is dispatched. Reader thread only. */
#define MAX_PASSED_FDS NVSHARE_RECV_MAX_FDS
static int passed_fds[MAX_PASSED_FDS];
static int n_passed_fds;

static int take_passed_fd(void)
{
    if (!n_passed_fds)
        return -1;
    int fd = passed_fds[0];
    memmove(passed_fds, passed_fds + 1, (size_t)--n_passed_fds * sizeof(int));
    return fd;
}

static void drop_passed_fds(void)
{
    while (n_passed_fds)
        close(passed_fds[--n_passed_fds]);
}

/* Reads len bytes, keeping the descriptors that come along (closed on exec). */
static int read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = nvshare_recv_fds(fd, p, len, passed_fds, MAX_PASSED_FDS, &n_passed_fds);
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- the connection thread ------------------------------------------------------------------ */
static int connect_daemon(int *err)
{
    int fd = nvshare_connect_unix(nvshare_cfg.socket_path);
    if (fd < 0)
        *err = errno;
    return fd;
}

/* connect() failed because nobody listens there (no socket file, no listener, no way to it): the
 * daemon is gone. Anything else (interrupted, out of descriptors) says nothing about the daemon. */
static int nobody_listens(int err)
{
    return err == ENOENT || err == ECONNREFUSED || err == ENOTDIR || err == EACCES || err == EPERM ||
           err == ENOTSOCK || err == EPROTOTYPE || err == ENAMETOOLONG;
}

static void refused_log(int32_t status, const char *message)
{
    char why[4 * sizeof ((struct nvshare_reply *)0)->message];
    nvshare_escape(why, sizeof why, message);
    nvshare_log("nvshare-scheduler refused this process (status %d: %s); GPU work runs unshared", status, why);
}

/* The answer to CLIENT_REGISTER, however long a busy daemon takes: past the deadline that is logged
 * once, and only a closed connection ends the wait. 0 when one is there. */
static int wait_for_answer(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    int late = 0;
    for (;;) {
        int ready = poll(&pfd, 1, late ? -1 : (int)nvshare_cfg.daemon_timeout_ms);
        if (ready > 0)
            return 0;
        if (ready < 0 && errno != EINTR)
            return -1;
        if (ready == 0 && !late) {
            late = 1;
            nvshare_outbox_note_stall("CLIENT_REGISTER", nvshare_cfg.daemon_timeout_ms);
        }
    }
}

/* 0 registered; -1 connection trouble (retry); -2 refused by the daemon (give up, pass through);
 * -3 the daemon does not know the job (yet). */
static int register_client(int fd)
{
    struct nvshare_client_register reg;
    memset(&reg, 0, sizeof reg);
    reg.job_id = nvshare_cfg.job_id;
    reg.step_id = nvshare_cfg.step_id;
    reg.pid = (int32_t)getpid();
    reg.mem_limit = nvshare_cfg.mem_limit;
    reg.flags = NVSHARE_CLIENT_PREFETCH;
    struct { struct nvshare_hdr hdr; struct nvshare_client_register body; } frame;
    nvshare_fill_header(&frame.hdr, NVSHARE_MSG_CLIENT_REGISTER, sizeof reg);
    frame.body = reg;
    if (write_all(fd, &frame, sizeof frame) != 0 || wait_for_answer(fd) != 0)
        return -1;
    struct nvshare_hdr hdr;
    if (read_all(fd, &hdr, sizeof hdr) != 0 || hdr.magic != NVSHARE_MAGIC ||
        hdr.version != NVSHARE_PROTO_VERSION || hdr.length > 4096)
        return -1;
    char payload[4096];
    if (read_all(fd, payload, hdr.length) != 0)
        return -1;
    nvshare_outbox_note_heard();
    if (hdr.type == NVSHARE_MSG_CLIENT_REGISTER_REPLY && hdr.length == sizeof(struct nvshare_client_register_reply)) {
        struct nvshare_client_register_reply rep;
        memcpy(&rep, payload, sizeof rep);
        rep.message[sizeof rep.message - 1] = '\0';
        if (rep.status == NVSHARE_ERR_NOJOB)
            return -3;
        if (rep.status != NVSHARE_OK) {
            refused_log(rep.status, rep.message);
            return -2;
        }
        if (rep.idle_release_us)
            nvshare_outbox_set_idle_release_us(rep.idle_release_us);
        return 0;
    }
    if (hdr.type == NVSHARE_MSG_REPLY && hdr.length == sizeof(struct nvshare_reply)) {
        struct nvshare_reply rep;
        memcpy(&rep, payload, sizeof rep);
        rep.message[sizeof rep.message - 1] = '\0';
        if (rep.status == NVSHARE_ERR_NOJOB)
            return -3;
        refused_log(rep.status, rep.message);
        return -2;
    }
    return -1;
}

/* A gpu_event payload, its uuid NUL-terminated; 0 when the frame is well formed. */
static int gpu_event_of(const struct nvshare_hdr *hdr, const char *payload, struct nvshare_gpu_event *ev)
{
    if (hdr->length != sizeof *ev)
        return -1;
    memcpy(ev, payload, sizeof *ev);
    ev->gpu_uuid[sizeof ev->gpu_uuid - 1] = '\0';
    return 0;
}

static void dispatch(const struct nvshare_hdr *hdr, const char *payload)
{
    const struct nvshare_link_events *on = events();
    struct nvshare_gpu_event ev;
    if (hdr->type == NVSHARE_MSG_HANDOFF || hdr->type == NVSHARE_MSG_BURST_PAGE) {
        int fd = take_passed_fd();
        if (gpu_event_of(hdr, payload, &ev) == 0 && on->gpu_event) {
            on->gpu_event(hdr->type, &ev, fd);   /* takes the descriptor */
            return;
        }
        if (fd >= 0)
            close(fd);
        nvshare_debug("message %u (%u bytes) not used: malformed", hdr->type, hdr->length);
        return;
    }
    if (hdr->type == NVSHARE_MSG_LOCK_GRANT || hdr->type == NVSHARE_MSG_LOCK_CONTENDED ||
        hdr->type == NVSHARE_MSG_DROP_LOCK || hdr->type == NVSHARE_MSG_WAIT_FOR_MEM ||
        hdr->type == NVSHARE_MSG_MEM_AVAILABLE || hdr->type == NVSHARE_MSG_PREPARE_SWAP_OUT ||
        hdr->type == NVSHARE_MSG_RESUMED || hdr->type == NVSHARE_MSG_PREFETCH) {
        if (gpu_event_of(hdr, payload, &ev) == 0) {
            if (on->gpu_event)
                on->gpu_event(hdr->type, &ev, -1);
            return;
        }
    }
    if (hdr->type == NVSHARE_MSG_MEM_REPLY && hdr->length == sizeof(struct nvshare_mem_reply)) {
        struct nvshare_mem_reply rep;
        memcpy(&rep, payload, sizeof rep);
        nvshare_outbox_answer(hdr->seq, rep.status, &rep);
        return;
    }
    if (hdr->type == NVSHARE_MSG_REPLY && hdr->length == sizeof(struct nvshare_reply)) {
        struct nvshare_reply rep;
        memcpy(&rep, payload, sizeof rep);
        rep.message[sizeof rep.message - 1] = '\0';
        if (nvshare_outbox_is_question(hdr->seq))
            nvshare_outbox_answer(hdr->seq, rep.status, NULL);
        else if (on->request_refused)
            on->request_refused(hdr->seq, rep.status, rep.message);
        return;
    }
    if (hdr->type == NVSHARE_MSG_HEARTBEAT)
        return;
    nvshare_debug("unexpected message type %u (%u bytes) from nvshare-scheduler", hdr->type, hdr->length);
}

/* Sends what the outbox holds, one frame at a time, on the connection it was queued for. */
static void *writer_main(void *arg)
{
    (void)arg;
    nvshare_in_hook = 1;
    for (;;) {
        char frame[sizeof(struct nvshare_hdr) + 4096];
        size_t len;
        int fd;
        nvshare_outbox_take(frame, sizeof frame, &len, &fd);
        if (len && write_all(fd, frame, len) != 0)
            shutdown(fd, SHUT_RDWR);  /* the reader sees it and reconnects */
        nvshare_outbox_sent();
    }
    return NULL;
}

/* Reads frames until the connection ends (or the queue to the daemon overflowed). A daemon that
 * answers no heartbeat within the deadline is busy: logged once, and waited for. */
static void read_frames(int fd)
{
    uint64_t last_heard = nvshare_now_ns(), heartbeat_sent = 0;
    for (;;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = poll(&pfd, 1, READER_TICK_MS);
        uint64_t now = nvshare_now_ns();
        if (ready < 0 && errno != EINTR)
            return;
        if (nvshare_outbox_silent())  /* the queue overflowed: the daemon reads nothing; reconnect */
            return;
        if (ready <= 0) {
            if (heartbeat_sent && now - heartbeat_sent > (uint64_t)nvshare_cfg.daemon_timeout_ms * 1000000ull)
                nvshare_outbox_note_stall("a heartbeat", (now - heartbeat_sent) / 1000000ull);
            if (!heartbeat_sent && now - last_heard > HEARTBEAT_AFTER_QUIET_NS && nvshare_outbox_heartbeat() == 0)
                heartbeat_sent = now;
            continue;
        }
        struct nvshare_hdr hdr;
        char payload[4096];
        if (read_all(fd, &hdr, sizeof hdr) != 0)
            return;
        if (hdr.magic != NVSHARE_MAGIC || hdr.version != NVSHARE_PROTO_VERSION || hdr.length > sizeof payload) {
            nvshare_log("malformed frame from nvshare-scheduler (type %u, %u bytes); reconnecting",
                        hdr.type, hdr.length);
            return;
        }
        if (read_all(fd, payload, hdr.length) != 0)
            return;
        last_heard = nvshare_now_ns();
        heartbeat_sent = 0;
        nvshare_outbox_note_heard();
        dispatch(&hdr, payload);
        drop_passed_fds();   /* a frame's descriptors are its own: none outlives its dispatch */
    }
}

static const char *loss_words(void)
{
    return nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN ? "GPU work runs unshared until it is back"
                                                        : "GPU work waits until it is back";
}

/* Nobody listens on the socket: the daemon is gone, and on_daemon_loss applies (events' down).
 * Said once until a registration succeeds again: a daemon in a restart loop fills no job's output. */
static void daemon_gone(int err, int *told)
{
    if (nvshare_outbox_daemon_gone())
        return;
    nvshare_outbox_set_gone(1);
    if (events()->down)
        events()->down();
    if (!*told)
        nvshare_log("cannot reach nvshare-scheduler at %s (%s); %s", nvshare_cfg.socket_path, strerror(err),
                    loss_words());
    *told = 1;
}

/* Connected again after it was gone: the daemon is there, so work is gated again from now on. */
static void daemon_back(void)
{
    if (!nvshare_outbox_daemon_gone())
        return;
    nvshare_outbox_set_gone(0);
    if (events()->down)
        events()->down();   /* no connection yet: nothing held, nothing passes ungated */
}

static void back_off(uint64_t *backoff_ms)
{
    struct timespec pause = {(time_t)(*backoff_ms / 1000), (long)(*backoff_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    *backoff_ms = *backoff_ms * 2 > RECONNECT_BACKOFF_MAX_MS ? RECONNECT_BACKOFF_MAX_MS : *backoff_ms * 2;
}

static void *client_main(void *arg)
{
    (void)arg;
    nvshare_in_hook = 1;
    uint64_t backoff_ms = 10, nojob_since = 0;
    int warned = 0, told_gone = 0, ever_connected = 0;
    for (;;) {
        int err = 0;
        int fd = connect_daemon(&err);
        if (fd < 0) {
            if (nobody_listens(err)) {
                daemon_gone(err, &told_gone);
            } else if (!warned) {
                nvshare_log("cannot connect to nvshare-scheduler at %s (%s); trying again, GPU work waits",
                            nvshare_cfg.socket_path, strerror(err));
            }
            warned = 1;
            back_off(&backoff_ms);
            continue;
        }
        daemon_back();
        int reg = register_client(fd);
        if (reg == -3) {
            uint64_t now = nvshare_now_ns();
            if (!nojob_since) {
                nojob_since = now;
                nvshare_debug("nvshare-scheduler does not know job %u yet; asking again", nvshare_cfg.job_id);
            }
            if (now - nojob_since < NOJOB_RETRY_NS) {
                close(fd);
                struct timespec pause = {0, NOJOB_RETRY_PAUSE_MS * 1000000L};
                nanosleep(&pause, NULL);
                continue;
            }
            nvshare_log("nvshare-scheduler refused this process (status %d: job not registered on this node "
                        "after %.0f s); GPU work runs unshared", NVSHARE_ERR_NOJOB, NOJOB_RETRY_NS / 1e9);
            reg = -2;
        }
        if (reg == -2) {
            close(fd);
            nvshare_outbox_set_refused();
            if (events()->refused)
                events()->refused();
            nvshare_outbox_link(-1);
            return NULL;
        }
        if (reg != 0) {
            close(fd);
            if (!warned)
                nvshare_log("nvshare-scheduler at %s closed the connection without answering CLIENT_REGISTER; "
                            "trying again, GPU work waits", nvshare_cfg.socket_path);
            warned = 1;
            back_off(&backoff_ms);
            continue;
        }
        backoff_ms = 10;
        nojob_since = 0;
        if (warned || ever_connected)
            nvshare_log("connected to nvshare-scheduler at %s", nvshare_cfg.socket_path);
        else
            nvshare_debug("connected to nvshare-scheduler at %s", nvshare_cfg.socket_path);
        warned = told_gone = 0;
        ever_connected = 1;
        nvshare_outbox_link(fd);
        if (events()->up)
            events()->up();
        read_frames(fd);
        drop_passed_fds();
        shutdown(fd, SHUT_RDWR);
        nvshare_outbox_link(-1);
        close(fd);
        if (events()->down)
            events()->down();
        nvshare_log("lost the connection to nvshare-scheduler; reconnecting (GPU work waits meanwhile)");
        warned = 1;
    }
    return NULL;
}

void nvshare_client_start(void)
{
    if (!nvshare_cfg.active)
        return;
    pthread_mutex_lock(&start_mu);
    if (!started) {
        started = 1;
        if (nvshare_start_thread(writer_main, NULL, THREAD_STACK_BYTES) != 0 ||
            nvshare_start_thread(client_main, NULL, THREAD_STACK_BYTES) != 0) {
            nvshare_log("cannot start the connection threads; GPU work runs unshared");
            nvshare_outbox_set_refused();
            if (events()->refused)
                events()->refused();
        }
    }
    pthread_mutex_unlock(&start_mu);
}

/* The child starts unconnected, with its own pid, and connects when it first needs a GPU. */
void nvshare_client_after_fork(void)
{
    pthread_mutex_init(&start_mu, NULL);
    started = 0;
    drop_passed_fds();   /* the parent's reader kept them; this process has copies */
}
