/* client.c: this process's one connection to nvshare-scheduler.
 *
 * A thread started lazily (cuInit or the first gated call) connects, sends CLIENT_REGISTER and then
 * reads daemon messages for the life of the process. Any thread may send (under send_mu). When the
 * daemon is unreachable the thread retries with backoff up to ~1 s; meanwhile gated work waits
 * (NVSHARE_ON_DAEMON_LOSS=wait) or passes (run). After a reconnect, memory is reported again and
 * waiting threads ask for their locks again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "nvshare_hook.h"

static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t send_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t conn_mu = PTHREAD_MUTEX_INITIALIZER;   /* guards pending[], connection epoch */
static pthread_cond_t conn_cv = PTHREAD_COND_INITIALIZER;
static int started;
static int sock_fd = -1;
static atomic_int connected;
static atomic_int refused;
static atomic_uint seq_counter;
static atomic_uint idle_release_us;
static unsigned epoch;  /* connections made so far; a request sent in an older one is lost */

#define MAX_PENDING 64
struct pending_mem {
    int used;
    int done;
    uint32_t seq;
    int32_t status;
    struct nvshare_mem_reply reply;
};
static struct pending_mem pending[MAX_PENDING];

int nvshare_client_connected(void) { return atomic_load(&connected); }
int nvshare_client_refused(void) { return atomic_load(&refused); }
uint32_t nvshare_client_idle_release_us(void) { return atomic_load(&idle_release_us); }

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

static int read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Fills a frame header with the next seq, which it returns. */
static uint32_t fill_header(struct nvshare_hdr *hdr, uint16_t type, uint32_t length)
{
    hdr->magic = NVSHARE_MAGIC;
    hdr->version = NVSHARE_PROTO_VERSION;
    hdr->type = type;
    hdr->length = length;
    hdr->seq = atomic_fetch_add(&seq_counter, 1) + 1;
    return hdr->seq;
}

static int send_frame(uint16_t type, const void *payload, uint32_t length, uint32_t *seq_out)
{
    struct {
        struct nvshare_hdr hdr;
        char payload[sizeof(struct nvshare_client_register_reply)];
    } frame;
    if (length > sizeof frame.payload)
        return -1;
    uint32_t seq = fill_header(&frame.hdr, type, length);
    memcpy(frame.payload, payload, length);
    pthread_mutex_lock(&send_mu);
    int rc = sock_fd >= 0 ? write_all(sock_fd, &frame, sizeof frame.hdr + length) : -1;
    pthread_mutex_unlock(&send_mu);
    if (rc == 0 && seq_out)
        *seq_out = seq;
    return rc;
}

int nvshare_send_gpu_event(uint16_t type, const char *uuid, uint32_t flags, uint64_t bytes,
                           uint32_t *seq_out)
{
    struct nvshare_gpu_event ev;
    memset(&ev, 0, sizeof ev);
    nvshare_copy_str(ev.gpu_uuid, sizeof ev.gpu_uuid, uuid);
    ev.flags = flags;
    ev.bytes = bytes;
    return send_frame(type, &ev, sizeof ev, seq_out);
}

int nvshare_send_demand(const struct nvshare_demand *demand)
{
    if (!atomic_load(&connected))
        return -1;
    return send_frame(NVSHARE_MSG_DEMAND, demand, sizeof *demand, NULL);
}

static void fill_mem_update(struct nvshare_mem_update *m, struct nvshare_gpu *g, uint64_t request,
                            uint32_t flags)
{
    struct nvshare_mem_numbers numbers;
    nvshare_mem_numbers(g, &numbers);
    memset(m, 0, sizeof *m);
    nvshare_copy_str(m->gpu_uuid, sizeof m->gpu_uuid, g->uuid);
    m->allocated = numbers.resident;
    m->fixed = numbers.fixed;
    m->swapped = numbers.swapped;
    m->request = request;
    m->flags = flags;
}

void nvshare_send_mem_report(struct nvshare_gpu *g)
{
    if (!atomic_load(&connected))
        return;
    struct nvshare_mem_update m;
    fill_mem_update(&m, g, 0, 0);
    send_frame(NVSHARE_MSG_MEM_UPDATE, &m, sizeof m, NULL);
}

int nvshare_mem_request(struct nvshare_gpu *g, uint64_t request, uint32_t flags,
                        struct nvshare_mem_reply *reply, int *answered)
{
    *answered = 0;
    nvshare_client_start();
    pthread_mutex_lock(&conn_mu);
    for (;;) {
        if (atomic_load(&refused) || atomic_load(&g->mode) == GPU_PASS)
            break;
        if (!atomic_load(&connected)) {
            if (nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN)
                break;
            pthread_cond_wait(&conn_cv, &conn_mu);
            continue;
        }
        int slot = -1;
        for (int i = 0; i < MAX_PENDING; i++)
            if (!pending[i].used) {
                slot = i;
                break;
            }
        if (slot < 0) {
            pthread_cond_wait(&conn_cv, &conn_mu);
            continue;
        }
        struct pending_mem *p = &pending[slot];
        memset(p, 0, sizeof *p);
        p->used = 1;
        unsigned my_epoch = epoch;
        pthread_mutex_unlock(&conn_mu);
        struct { struct nvshare_hdr hdr; struct nvshare_mem_update body; } frame;
        fill_mem_update(&frame.body, g, request, flags);
        /* Reserve the seq before sending so the reply cannot overtake the bookkeeping. */
        pthread_mutex_lock(&send_mu);
        uint32_t seq = fill_header(&frame.hdr, NVSHARE_MSG_MEM_UPDATE, sizeof frame.body);
        pthread_mutex_lock(&conn_mu);
        p->seq = seq;
        pthread_mutex_unlock(&conn_mu);
        int rc = sock_fd >= 0 ? write_all(sock_fd, &frame, sizeof frame) : -1;
        pthread_mutex_unlock(&send_mu);
        pthread_mutex_lock(&conn_mu);
        while (rc == 0 && !p->done && epoch == my_epoch && atomic_load(&connected))
            pthread_cond_wait(&conn_cv, &conn_mu);
        int done = p->done;
        int32_t status = p->status;
        if (done)
            *reply = p->reply;
        p->used = 0;
        pthread_cond_broadcast(&conn_cv);
        if (!done) {
            /* Connection lost before the answer: ask again on the next one (or pass with 'run'). */
            if (rc != 0 && atomic_load(&connected)) {
                struct timespec pause = {0, 10000000};
                pthread_mutex_unlock(&conn_mu);
                nanosleep(&pause, NULL);
                pthread_mutex_lock(&conn_mu);
            }
            continue;
        }
        pthread_mutex_unlock(&conn_mu);
        if (status == NVSHARE_ERR_NOGPU) {
            atomic_store(&g->mode, GPU_PASS);
            atomic_store(&g->open, 1);
            return 0;
        }
        *answered = 1;
        return status == NVSHARE_ERR_NOMEM ? 1 : 0;
    }
    pthread_mutex_unlock(&conn_mu);
    return 0;
}

static void complete_pending(uint32_t seq, int32_t status, const struct nvshare_mem_reply *reply)
{
    pthread_mutex_lock(&conn_mu);
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i].used && !pending[i].done && pending[i].seq == seq) {
            pending[i].done = 1;
            pending[i].status = status;
            if (reply)
                pending[i].reply = *reply;
            pthread_cond_broadcast(&conn_cv);
            break;
        }
    pthread_mutex_unlock(&conn_mu);
}

static int is_pending(uint32_t seq)
{
    int found = 0;
    pthread_mutex_lock(&conn_mu);
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i].used && !pending[i].done && pending[i].seq == seq)
            found = 1;
    pthread_mutex_unlock(&conn_mu);
    return found;
}

/* ---- the connection thread ------------------------------------------------------------------ */
static int connect_daemon(int *err)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    nvshare_copy_str(addr.sun_path, sizeof addr.sun_path, nvshare_cfg.socket_path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    return fd;
}

/* 0 registered; -1 connection trouble (retry); -2 refused by the daemon (give up, pass through). */
static int register_client(int fd)
{
    struct nvshare_client_register reg;
    memset(&reg, 0, sizeof reg);
    reg.job_id = nvshare_cfg.job_id;
    reg.step_id = nvshare_cfg.step_id;
    reg.pid = (int32_t)getpid();
    reg.mem_limit = nvshare_cfg.mem_limit;
    struct { struct nvshare_hdr hdr; struct nvshare_client_register body; } frame;
    fill_header(&frame.hdr, NVSHARE_MSG_CLIENT_REGISTER, sizeof reg);
    frame.body = reg;
    if (write_all(fd, &frame, sizeof frame) != 0)
        return -1;
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) <= 0)
        return -1;
    struct nvshare_hdr hdr;
    if (read_all(fd, &hdr, sizeof hdr) != 0 || hdr.magic != NVSHARE_MAGIC ||
        hdr.version != NVSHARE_PROTO_VERSION || hdr.length > 4096)
        return -1;
    char payload[4096];
    if (read_all(fd, payload, hdr.length) != 0)
        return -1;
    if (hdr.type == NVSHARE_MSG_CLIENT_REGISTER_REPLY && hdr.length == sizeof(struct nvshare_client_register_reply)) {
        struct nvshare_client_register_reply rep;
        memcpy(&rep, payload, sizeof rep);
        rep.message[sizeof rep.message - 1] = '\0';
        if (rep.status != NVSHARE_OK) {
            nvshare_log("nvshare-scheduler refused this process (status %d: %s); GPU work runs unshared",
                        rep.status, rep.message);
            return -2;
        }
        if (rep.idle_release_us)
            atomic_store(&idle_release_us, rep.idle_release_us);
        return 0;
    }
    if (hdr.type == NVSHARE_MSG_REPLY && hdr.length == sizeof(struct nvshare_reply)) {
        struct nvshare_reply rep;
        memcpy(&rep, payload, sizeof rep);
        rep.message[sizeof rep.message - 1] = '\0';
        nvshare_log("nvshare-scheduler refused this process (status %d: %s); GPU work runs unshared",
                    rep.status, rep.message);
        return -2;
    }
    return -1;
}

static void dispatch(const struct nvshare_hdr *hdr, const char *payload)
{
    if (hdr->length == sizeof(struct nvshare_gpu_event) &&
        (hdr->type == NVSHARE_MSG_LOCK_GRANT || hdr->type == NVSHARE_MSG_LOCK_CONTENDED ||
         hdr->type == NVSHARE_MSG_DROP_LOCK || hdr->type == NVSHARE_MSG_WAIT_FOR_MEM ||
         hdr->type == NVSHARE_MSG_MEM_AVAILABLE || hdr->type == NVSHARE_MSG_PREPARE_SWAP_OUT)) {
        struct nvshare_gpu_event ev;
        memcpy(&ev, payload, sizeof ev);
        ev.gpu_uuid[sizeof ev.gpu_uuid - 1] = '\0';
        struct nvshare_gpu *g = nvshare_gpu_by_uuid(ev.gpu_uuid);
        if (!g) {
            nvshare_debug("gpu %s: message %u for a GPU this process does not use", ev.gpu_uuid, hdr->type);
            if (hdr->type == NVSHARE_MSG_LOCK_GRANT || hdr->type == NVSHARE_MSG_DROP_LOCK)
                nvshare_send_gpu_event(NVSHARE_MSG_LOCK_RELEASED, ev.gpu_uuid, NVSHARE_RELEASE_DROPPED, 0, NULL);
            return;
        }
        switch (hdr->type) {
        case NVSHARE_MSG_LOCK_GRANT: nvshare_on_grant(g, ev.flags, ev.switch_ms); break;
        case NVSHARE_MSG_LOCK_CONTENDED: nvshare_on_contended(g, ev.bytes); break;
        case NVSHARE_MSG_DROP_LOCK: nvshare_on_drop(g, ev.switch_ms, ev.bytes); break;
        case NVSHARE_MSG_PREPARE_SWAP_OUT: nvshare_on_prepare_swap_out(g, ev.bytes); break;
        default: nvshare_debug("gpu %s: message %u not handled yet", g->uuid, hdr->type); break;
        }
        return;
    }
    if (hdr->type == NVSHARE_MSG_MEM_REPLY && hdr->length == sizeof(struct nvshare_mem_reply)) {
        struct nvshare_mem_reply rep;
        memcpy(&rep, payload, sizeof rep);
        complete_pending(hdr->seq, rep.status, &rep);
        return;
    }
    if (hdr->type == NVSHARE_MSG_REPLY && hdr->length == sizeof(struct nvshare_reply)) {
        struct nvshare_reply rep;
        memcpy(&rep, payload, sizeof rep);
        rep.message[sizeof rep.message - 1] = '\0';
        if (is_pending(hdr->seq))
            complete_pending(hdr->seq, rep.status, NULL);
        else
            nvshare_on_request_refused(hdr->seq, rep.status, rep.message);
        return;
    }
    if (hdr->type == NVSHARE_MSG_HEARTBEAT)
        return;
    nvshare_debug("unexpected message type %u (%u bytes) from nvshare-scheduler", hdr->type, hdr->length);
}

static void set_connected(int fd)
{
    pthread_mutex_lock(&send_mu);
    sock_fd = fd;
    pthread_mutex_unlock(&send_mu);
    pthread_mutex_lock(&conn_mu);
    epoch++;
    atomic_store(&connected, fd >= 0);
    pthread_cond_broadcast(&conn_cv);
    pthread_mutex_unlock(&conn_mu);
}

static void *client_main(void *arg)
{
    (void)arg;
    nvshare_in_hook = 1;
    uint64_t backoff_ms = 10;
    int warned = 0, ever_connected = 0;
    for (;;) {
        int err = 0;
        int fd = connect_daemon(&err);
        int reg = fd >= 0 ? register_client(fd) : -1;
        if (reg == -2) {
            close(fd);
            atomic_store(&refused, 1);
            nvshare_gates_open_all("refused");
            set_connected(-1);
            return NULL;
        }
        if (reg != 0) {
            if (fd >= 0)
                close(fd);
            if (!warned) {
                nvshare_log("cannot reach nvshare-scheduler at %s (%s); %s", nvshare_cfg.socket_path,
                            fd >= 0 || !err ? "no answer to CLIENT_REGISTER" : strerror(err),
                            nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN
                                ? "GPU work runs unshared until it is back"
                                : "GPU work waits until it is back");
                warned = 1;
            }
            struct timespec pause = {(time_t)(backoff_ms / 1000), (long)(backoff_ms % 1000) * 1000000L};
            nanosleep(&pause, NULL);
            backoff_ms = backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2;
            continue;
        }
        backoff_ms = 10;
        if (warned || ever_connected)
            nvshare_log("connected to nvshare-scheduler at %s", nvshare_cfg.socket_path);
        else
            nvshare_debug("connected to nvshare-scheduler at %s", nvshare_cfg.socket_path);
        warned = 0;
        ever_connected = 1;
        set_connected(fd);
        nvshare_on_connection_change(1);
        nvshare_memory_resend();
        for (;;) {
            struct nvshare_hdr hdr;
            char payload[4096];
            if (read_all(fd, &hdr, sizeof hdr) != 0)
                break;
            if (hdr.magic != NVSHARE_MAGIC || hdr.version != NVSHARE_PROTO_VERSION || hdr.length > sizeof payload) {
                nvshare_log("malformed frame from nvshare-scheduler (type %u, %u bytes); reconnecting",
                            hdr.type, hdr.length);
                break;
            }
            if (read_all(fd, payload, hdr.length) != 0)
                break;
            dispatch(&hdr, payload);
        }
        set_connected(-1);
        close(fd);
        nvshare_on_connection_change(0);
        nvshare_log("lost the connection to nvshare-scheduler; %s",
                    nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN ? "GPU work runs unshared until it is back"
                                                                : "GPU work waits until it is back");
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
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        if (pthread_create(&tid, &attr, client_main, NULL) != 0) {
            nvshare_log("cannot start the connection thread; GPU work runs unshared");
            atomic_store(&refused, 1);
            nvshare_gates_open_all("no thread");
        } else {
            nvshare_demand_start();
        }
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&start_mu);
}

/* The child starts unconnected, with its own pid, and connects when it first needs a GPU. */
void nvshare_client_after_fork(void)
{
    pthread_mutex_init(&start_mu, NULL);
    pthread_mutex_init(&send_mu, NULL);
    pthread_mutex_init(&conn_mu, NULL);
    pthread_cond_init(&conn_cv, NULL);
    if (sock_fd >= 0)
        close(sock_fd);
    sock_fd = -1;
    started = 0;
    atomic_store(&connected, 0);
    atomic_store(&refused, 0);
    memset(pending, 0, sizeof pending);
    epoch = 0;
}
