/* outbox.h: what this process tells nvshare-scheduler, queued without I/O, and the state of the link
 * (outbox.c). The gate, memory accounting and the demand sampler put frames here and return at once;
 * client.c's threads send them and bring the answers. Calls only env.c.
 */
#ifndef NVSHARE_OUTBOX_H
#define NVSHARE_OUTBOX_H

#include <stddef.h>
#include <stdint.h>

#include "nvshare_proto.h"

/* Queue without I/O; never blocks on the daemon. 0 when queued on a live connection. */
int nvshare_outbox_gpu_event(uint16_t type, const char *uuid, uint32_t flags, uint64_t bytes,
                             uint32_t *seq_out);
void nvshare_outbox_mem_update(const struct nvshare_mem_update *m);
int nvshare_outbox_heartbeat(void);
/* DEMAND: what this process asks of a GPU lately (demand.c measures it). */
int nvshare_outbox_demand(const struct nvshare_demand *demand);
/* A question (MEM_UPDATE with a request) and its answer, with the daemon's deadline. */
enum { NVSHARE_ASK_ANSWERED = 0, NVSHARE_ASK_NO_DAEMON = 1, NVSHARE_ASK_LATE = 2 };
int nvshare_outbox_ask(const struct nvshare_mem_update *question, int32_t *status,
                       struct nvshare_mem_reply *reply);
/* The same, but the asker stops waiting at give_up_ns (nvshare_now_ns's clock; 0: never):
 * NVSHARE_ASK_LATE, and an answer that comes after is dropped. */
int nvshare_outbox_ask_until(const struct nvshare_mem_update *question, int32_t *status,
                             struct nvshare_mem_reply *reply, uint64_t give_up_ns);
int nvshare_outbox_connected(void);
int nvshare_outbox_refused(void);
int nvshare_outbox_silent(void);
/* No connection, and the last connect found nobody listening (not merely a slow daemon): the one
 * state in which on_daemon_loss=run lets gated work pass. */
int nvshare_outbox_daemon_gone(void);
/* A deadline passed with the connection open: logged once per stall; the next frame from the
 * daemon ends the stall (logged too). */
void nvshare_outbox_note_stall(const char *what, uint64_t waited_ms);
void nvshare_outbox_note_heard(void);
uint32_t nvshare_outbox_idle_release_us(void);
/* The one frame header: magic, version, type, length, and the next sequence number (returned). */
uint32_t nvshare_fill_header(struct nvshare_hdr *hdr, uint16_t type, uint32_t length);

/* For client.c only: the link's state, answers, and the frames to write. */
void nvshare_outbox_set_idle_release_us(uint32_t us);
void nvshare_outbox_set_refused(void);
void nvshare_outbox_set_gone(int gone);
void nvshare_outbox_link(int fd);
void nvshare_outbox_answer(uint32_t seq, int32_t status, const struct nvshare_mem_reply *reply);
int nvshare_outbox_is_question(uint32_t seq);
int nvshare_outbox_take(void *frame, size_t cap, size_t *len, int *fd);
void nvshare_outbox_sent(void);
void nvshare_outbox_after_fork(void);

#endif
