/* outbox.c: what this process tells nvshare-scheduler, queued without I/O, and the state of the link.
 *
 * The gate and the memory accounting put frames here and return at once: no thread that holds a gate
 * mutex, or that runs CUDA calls, ever writes to the socket. client.c's writer thread takes frames
 * out and sends them; its reader thread marks the link up or down and completes round trips. A frame
 * queued on one connection is never sent on the next: after a reconnect the gate asks again and
 * memory.c reports again. A round trip (MEM_UPDATE with a request) waits as long as the connection
 * is open: a daemon that is slow to answer is busy, not lost (its deadline only logs, once). The
 * daemon counts as gone only when client.c finds nobody listening on its socket (link_gone); then
 * 'run' lets work pass. Reports and DEMAND frames merge per GPU while unsent, so a daemon that
 * reads slowly never fills the queue.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>
#include <stdatomic.h>

#include "env.h"
#include "outbox.h"

/* Frames waiting for the writer: lock events, memory reports, questions. A process has a handful
 * outstanding per GPU; memory reports for one GPU are merged while unsent. */
#define OUTBOX_FRAMES 256
#define OUTBOX_PAYLOAD sizeof(struct nvshare_mem_update)
_Static_assert(sizeof(struct nvshare_demand) <= OUTBOX_PAYLOAD, "a DEMAND frame fits the outbox");
#define MAX_PENDING 64

/* A memory report alone in the outbox waits this long for newer numbers to merge into it: a
 * program allocating and freeing every 100 us sent the daemon two reports each time, and the
 * daemon's pass over each (tens of microseconds of Python) delayed the next question behind them.
 * Any other frame queued behind it sends it at once; a question carries its own numbers. */
#define REPORT_HOLD_NS 1000000ull

struct queued {                    /* hdr and payload go out as they lie: one frame */
    struct nvshare_hdr hdr;
    char payload[OUTBOX_PAYLOAD];
    uint64_t queued_ns;
};

static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t writer_cv;   /* the writer: frames or a new connection */
static pthread_cond_t reply_cv;    /* round trips: answers, and link changes */
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static struct queued ring[OUTBOX_FRAMES];
static unsigned head, count;
static unsigned epoch;             /* connections so far; frames and questions belong to one */
static int link_fd = -1;
static int writing;                /* the writer holds link_fd: it is not closed under it */
static atomic_int link_up;
static atomic_int link_refused;
static atomic_int link_silent;     /* the queue overflowed: the daemon reads nothing; reconnect */
static atomic_int link_gone;       /* the last connect found nobody listening: the daemon is gone */
static atomic_int stall_told;      /* a stall was logged; the next frame from the daemon says so */
static _Atomic uint64_t stall_began_ns;
static atomic_uint seq_counter;
static atomic_uint idle_release_us;

struct pending {
    int used, done;
    uint32_t seq;
    unsigned epoch;
    int32_t status;
    struct nvshare_mem_reply reply;
};
static struct pending pending[MAX_PENDING];

static void init_cvs(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&writer_cv, &attr);
    pthread_cond_init(&reply_cv, &attr);
    pthread_condattr_destroy(&attr);
}

static void lock_outbox(void)
{
    pthread_once(&cv_once, init_cvs);
    pthread_mutex_lock(&out_mu);
}

int nvshare_outbox_connected(void) { return atomic_load(&link_up); }
int nvshare_outbox_refused(void) { return atomic_load(&link_refused); }
int nvshare_outbox_silent(void) { return atomic_load(&link_silent); }
int nvshare_outbox_daemon_gone(void) { return atomic_load(&link_gone) && !atomic_load(&link_up); }
uint32_t nvshare_outbox_idle_release_us(void) { return atomic_load(&idle_release_us); }
void nvshare_outbox_set_idle_release_us(uint32_t us) { atomic_store(&idle_release_us, us); }
void nvshare_outbox_set_refused(void)
{
    lock_outbox();
    atomic_store(&link_refused, 1);
    pthread_cond_broadcast(&reply_cv);   /* questions waiting for a connection pass now */
    pthread_mutex_unlock(&out_mu);
}

void nvshare_outbox_set_gone(int gone)
{
    lock_outbox();
    atomic_store(&link_gone, gone);
    pthread_cond_broadcast(&reply_cv);   /* with 'run', questions waiting for a connection pass */
    pthread_mutex_unlock(&out_mu);
}

void nvshare_outbox_note_stall(const char *what, uint64_t waited_ms)
{
    if (atomic_exchange(&stall_told, 1))
        return;
    atomic_store(&stall_began_ns, nvshare_now_ns() - waited_ms * 1000000ull);
    nvshare_log("nvshare-scheduler has not answered %s for %llu ms, but its connection is open: it is busy, "
                "not lost, so GPU work waits for it (on_daemon_loss applies only once it is gone)", what,
                (unsigned long long)waited_ms);
}

void nvshare_outbox_note_heard(void)
{
    if (!atomic_load_explicit(&stall_told, memory_order_relaxed) || !atomic_exchange(&stall_told, 0))
        return;
    nvshare_log("nvshare-scheduler answers again (after %.1f s)",
                (double)(nvshare_now_ns() - atomic_load(&stall_began_ns)) / 1e9);
}

uint32_t nvshare_fill_header(struct nvshare_hdr *hdr, uint16_t type, uint32_t length)
{
    hdr->magic = NVSHARE_MAGIC;
    hdr->version = NVSHARE_PROTO_VERSION;
    hdr->type = type;
    hdr->length = length;
    hdr->seq = atomic_fetch_add(&seq_counter, 1) + 1;
    return hdr->seq;
}

/* A frame only the newest of which matters: a memory report (MEM_UPDATE without a request) or DEMAND.
 * Both begin with the GPU's uuid. */
static int mergeable(uint16_t type, const void *payload)
{
    _Static_assert(offsetof(struct nvshare_mem_update, gpu_uuid) == 0, "uuid first");
    _Static_assert(offsetof(struct nvshare_demand, gpu_uuid) == 0, "uuid first");
    return type == NVSHARE_MSG_DEMAND ||
           (type == NVSHARE_MSG_MEM_UPDATE && ((const struct nvshare_mem_update *)payload)->request == 0);
}

/* With out_mu held: the unsent frame of this kind for this GPU, to be merged with a newer one. */
static struct queued *unsent_of(uint16_t type, const char *uuid)
{
    for (unsigned i = 0; i < count; i++) {
        struct queued *q = &ring[(head + i) % OUTBOX_FRAMES];
        if (q->hdr.type == type && mergeable(type, q->payload) &&
            strncmp(q->payload, uuid, NVSHARE_UUID_LEN) == 0)
            return q;
    }
    return NULL;
}

/* With out_mu held: queues a frame on the current connection; its seq, or 0 when it cannot go. */
static uint32_t enqueue(uint16_t type, const void *payload, uint32_t length)
{
    if (!atomic_load(&link_up) || length > OUTBOX_PAYLOAD)
        return 0;
    if (mergeable(type, payload)) {
        struct queued *old = unsent_of(type, payload);
        if (old) {
            /* Only the newest numbers (and whether a swap-out is still under way, MOVING) matter;
             * that a report ends a PREFETCH stays said. */
            uint32_t ended = type == NVSHARE_MSG_MEM_UPDATE
                ? ((struct nvshare_mem_update *)old->payload)->flags &
                  (NVSHARE_MEM_PREFETCH_DONE | NVSHARE_MEM_PREFETCH_SHORT) : 0;
            memcpy(old->payload, payload, length);
            if (type == NVSHARE_MSG_MEM_UPDATE)
                ((struct nvshare_mem_update *)old->payload)->flags |= ended;
            return old->hdr.seq;
        }
    }
    if (count == OUTBOX_FRAMES) {
        nvshare_log("the queue to nvshare-scheduler is full (it reads nothing); message %u dropped", type);
        atomic_store(&link_silent, 1);
        return 0;
    }
    struct queued *q = &ring[(head + count) % OUTBOX_FRAMES];
    uint32_t seq = nvshare_fill_header(&q->hdr, type, length);
    q->queued_ns = nvshare_now_ns();
    memcpy(q->payload, payload, length);
    count++;
    pthread_cond_signal(&writer_cv);
    return seq;
}

int nvshare_outbox_gpu_event(uint16_t type, const char *uuid, uint32_t flags, uint64_t bytes,
                             uint32_t *seq_out)
{
    struct nvshare_gpu_event ev;
    memset(&ev, 0, sizeof ev);
    nvshare_copy_str(ev.gpu_uuid, sizeof ev.gpu_uuid, uuid);
    ev.flags = flags;
    ev.bytes = bytes;
    lock_outbox();
    uint32_t seq = enqueue(type, &ev, sizeof ev);
    pthread_mutex_unlock(&out_mu);
    if (seq && seq_out)
        *seq_out = seq;
    return seq ? 0 : -1;
}

void nvshare_outbox_mem_update(const struct nvshare_mem_update *m)
{
    lock_outbox();
    enqueue(NVSHARE_MSG_MEM_UPDATE, m, sizeof *m);
    pthread_mutex_unlock(&out_mu);
}

int nvshare_outbox_demand(const struct nvshare_demand *demand)
{
    lock_outbox();
    uint32_t seq = enqueue(NVSHARE_MSG_DEMAND, demand, sizeof *demand);
    pthread_mutex_unlock(&out_mu);
    return seq ? 0 : -1;
}

int nvshare_outbox_heartbeat(void)
{
    struct nvshare_heartbeat hb = {nvshare_now_ns()};
    lock_outbox();
    uint32_t seq = enqueue(NVSHARE_MSG_HEARTBEAT, &hb, sizeof hb);
    pthread_mutex_unlock(&out_mu);
    return seq ? 0 : -1;
}

static void deadline_in(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += (uint64_t)ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000ull);
    ts->tv_nsec = (long)(ns % 1000000000ull);
}

static void deadline_at(struct timespec *ts, uint64_t at_ns)
{
    ts->tv_sec = (time_t)(at_ns / 1000000000ull);
    ts->tv_nsec = (long)(at_ns % 1000000000ull);
}

/* With out_mu held: waits on reply_cv, until give_up_ns (CLOCK_MONOTONIC) when it is not 0;
 * 1 once that has passed. */
static int wait_reply(uint64_t give_up_ns)
{
    if (!give_up_ns) {
        pthread_cond_wait(&reply_cv, &out_mu);
        return 0;
    }
    if (nvshare_now_ns() >= give_up_ns)
        return 1;
    struct timespec until;
    deadline_at(&until, give_up_ns);
    pthread_cond_timedwait(&reply_cv, &out_mu, &until);
    return nvshare_now_ns() >= give_up_ns;
}

int nvshare_outbox_ask_until(const struct nvshare_mem_update *question, int32_t *status,
                             struct nvshare_mem_reply *reply, uint64_t give_up_ns)
{
    lock_outbox();
    for (;;) {
        if (atomic_load(&link_refused)) {
            pthread_mutex_unlock(&out_mu);
            return NVSHARE_ASK_NO_DAEMON;
        }
        if (!atomic_load(&link_up) || atomic_load(&link_silent)) {
            if (nvshare_cfg.loss_policy == NVSHARE_LOSS_RUN && atomic_load(&link_gone)) {
                pthread_mutex_unlock(&out_mu);
                return NVSHARE_ASK_NO_DAEMON;
            }
            if (wait_reply(give_up_ns)) {  /* until a connection answers, or it is gone */
                pthread_mutex_unlock(&out_mu);
                return NVSHARE_ASK_LATE;
            }
            continue;
        }
        struct pending *p = NULL;
        for (int i = 0; i < MAX_PENDING && !p; i++)
            if (!pending[i].used)
                p = &pending[i];
        if (!p) {
            if (wait_reply(give_up_ns)) {
                pthread_mutex_unlock(&out_mu);
                return NVSHARE_ASK_LATE;
            }
            continue;
        }
        memset(p, 0, sizeof *p);
        p->used = 1;
        p->epoch = epoch;
        p->seq = enqueue(NVSHARE_MSG_MEM_UPDATE, question, sizeof *question);
        /* As long as the connection is open: past the deadline the daemon is busy, not lost. */
        uint64_t stall_ns = nvshare_now_ns() + (uint64_t)nvshare_cfg.daemon_timeout_ms * 1000000ull;
        int late = 0, given_up = 0;
        while (p->seq && !p->done && p->epoch == epoch && atomic_load(&link_up)) {
            uint64_t now = nvshare_now_ns();
            if (give_up_ns && now >= give_up_ns) {
                given_up = 1;
                break;
            }
            if (!late && now >= stall_ns) {
                late = 1;
                nvshare_outbox_note_stall("a memory question", nvshare_cfg.daemon_timeout_ms);
            }
            uint64_t wake = late || (give_up_ns && give_up_ns < stall_ns) ? give_up_ns : stall_ns;
            if (!wake) {
                pthread_cond_wait(&reply_cv, &out_mu);
            } else {
                struct timespec until;
                deadline_at(&until, wake);
                pthread_cond_timedwait(&reply_cv, &out_mu, &until);
            }
        }
        int done = p->done;
        *status = p->status;
        if (done)
            *reply = p->reply;
        p->used = 0;   /* an answer after this finds no question and is dropped */
        pthread_cond_broadcast(&reply_cv);
        if (done || given_up) {
            pthread_mutex_unlock(&out_mu);
            return done ? NVSHARE_ASK_ANSWERED : NVSHARE_ASK_LATE;
        }
        /* The connection ended, or the question could not be queued: ask again on the next
         * connection (or pass, with 'run', once the daemon is gone). */
    }
}

int nvshare_outbox_ask(const struct nvshare_mem_update *question, int32_t *status,
                       struct nvshare_mem_reply *reply)
{
    return nvshare_outbox_ask_until(question, status, reply, 0);
}

void nvshare_outbox_answer(uint32_t seq, int32_t status, const struct nvshare_mem_reply *reply)
{
    lock_outbox();
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i].used && !pending[i].done && pending[i].seq == seq && pending[i].epoch == epoch) {
            pending[i].done = 1;
            pending[i].status = status;
            if (reply)
                pending[i].reply = *reply;
            pthread_cond_broadcast(&reply_cv);
            break;
        }
    pthread_mutex_unlock(&out_mu);
}

int nvshare_outbox_is_question(uint32_t seq)
{
    int found = 0;
    lock_outbox();
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i].used && !pending[i].done && pending[i].seq == seq)
            found = 1;
    pthread_mutex_unlock(&out_mu);
    return found;
}

void nvshare_outbox_link(int fd)
{
    lock_outbox();
    while (fd < 0 && writing)  /* the caller shut the socket down: the write in progress fails */
        pthread_cond_wait(&reply_cv, &out_mu);
    epoch++;
    link_fd = fd;
    head = count = 0;  /* nothing queued for an older connection is sent on this one */
    atomic_store(&link_silent, 0);
    atomic_store(&stall_told, 0);   /* a stall of an older connection is not this one's */
    if (fd >= 0)
        atomic_store(&link_gone, 0);
    atomic_store(&link_up, fd >= 0);
    pthread_cond_broadcast(&writer_cv);
    pthread_cond_broadcast(&reply_cv);
    pthread_mutex_unlock(&out_mu);
}

int nvshare_outbox_take(void *frame, size_t cap, size_t *len, int *fd)
{
    lock_outbox();
    for (;;) {
        while (!(count && link_fd >= 0))
            pthread_cond_wait(&writer_cv, &out_mu);
        const struct queued *first = &ring[head];
        uint64_t now = nvshare_now_ns();
        if (count > 1 || first->hdr.type != NVSHARE_MSG_MEM_UPDATE ||
            ((const struct nvshare_mem_update *)first->payload)->request != 0 ||
            now >= first->queued_ns + REPORT_HOLD_NS)
            break;
        struct timespec until;
        deadline_in(&until, first->queued_ns + REPORT_HOLD_NS - now);
        pthread_cond_timedwait(&writer_cv, &out_mu, &until);
    }
    struct queued *q = &ring[head];
    size_t n = sizeof q->hdr + q->hdr.length;
    if (n <= cap) {
        memcpy(frame, q, n);
        *len = n;
    } else {
        *len = 0;
    }
    head = (head + 1) % OUTBOX_FRAMES;
    count--;
    *fd = link_fd;
    writing = 1;
    pthread_mutex_unlock(&out_mu);
    return 0;
}

void nvshare_outbox_sent(void)
{
    lock_outbox();
    writing = 0;
    pthread_cond_broadcast(&reply_cv);
    pthread_mutex_unlock(&out_mu);
}

void nvshare_outbox_after_fork(void)
{
    pthread_mutex_init(&out_mu, NULL);
    init_cvs();
    head = count = 0;
    epoch = 0;
    if (link_fd >= 0)
        close(link_fd);  /* the parent's connection; the child makes its own */
    link_fd = -1;
    writing = 0;
    atomic_store(&link_up, 0);
    atomic_store(&link_refused, 0);
    atomic_store(&link_silent, 0);
    atomic_store(&link_gone, 0);     /* the child finds out for itself */
    atomic_store(&stall_told, 0);
    memset(pending, 0, sizeof pending);
}
