/* client.h: the wire (client.c). One connection to nvshare-scheduler: connect, CLIENT_REGISTER, a
 * reader thread that decodes frames into events, a writer thread that sends what the outbox holds.
 *
 * The reader calls nothing above it: what the daemon says goes to the handlers the top layer
 * registered (events.c, installed by hook.c's constructor). Calls only outbox.c, sockio.c, env.c
 * and driver.c.
 */
#ifndef NVSHARE_CLIENT_H
#define NVSHARE_CLIENT_H

#include <stdint.h>

#include "nvshare_proto.h"

struct nvshare_link_events {
    /* Connected and registered: waiting threads may ask again, numbers are sent again. */
    void (*up)(void);
    /* The connection ended (lost, or the daemon fell silent). */
    void (*down)(void);
    /* The daemon refused this process as a client, or no connection thread could start: for good. */
    void (*refused)(void);
    /* A well-formed gpu_event frame (LOCK_GRANT, LOCK_CONTENDED, DROP_LOCK, PREPARE_SWAP_OUT,
     * WAIT_FOR_MEM, MEM_AVAILABLE, HANDOFF, BURST_PAGE), its uuid NUL-terminated. fd: the descriptor
     * that came with HANDOFF or BURST_PAGE (the handler owns it), else -1. */
    void (*gpu_event)(uint16_t type, const struct nvshare_gpu_event *ev, int fd);
    /* A REPLY that answers no question: the daemon refused the request with this seq. */
    void (*request_refused)(uint32_t seq, int32_t status, const char *message);
};

/* Set once, before the first connection (hook.c's constructor). */
void nvshare_client_set_events(const struct nvshare_link_events *events);
/* Makes sure the connection is being made (lazily: processes that never use CUDA never connect). */
void nvshare_client_start(void);
void nvshare_client_after_fork(void);

#endif
