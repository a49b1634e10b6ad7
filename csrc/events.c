/* events.c: what the daemon says, turned into calls on the part it concerns.
 *
 * client.c's reader thread decodes frames and calls the handlers registered here; it calls nothing
 * above itself. This file is the one that knows which part takes which message: lock events go to
 * the gate, a burst page to burst.c, a new connection to the gate (waiters ask again), to memory
 * accounting (numbers sent again) and to the demand sampler (started with the first connection).
 */
#include <unistd.h>

#include "burst.h"
#include "client.h"
#include "demand.h"
#include "env.h"
#include "events.h"
#include "gate.h"
#include "gpus.h"
#include "memory.h"
#include "outbox.h"

static void link_up(void)
{
    nvshare_gate_on_connection_change(1);
    nvshare_memory_resend();
    nvshare_demand_start();
}

static void link_down(void)
{
    nvshare_gate_on_connection_change(0);
}

static void link_refused(void)
{
    nvshare_gates_open_all();
}

static void burst_page(struct nvshare_gpu *g, int fd)
{
    if (fd < 0 || !g || nvshare_burst_attach(g, fd) != 0) {
        if (fd >= 0 && !g)
            close(fd);
        nvshare_debug("burst page for %s not used (%s)", g ? g->uuid : "another GPU",
                      fd < 0 ? "no descriptor came with it" : g ? "not a sealed page" : "not this process's");
    }
}

static void gpu_event(uint16_t type, const struct nvshare_gpu_event *ev, int fd)
{
    struct nvshare_gpu *g = nvshare_gpu_by_uuid(ev->gpu_uuid);
    if (type == NVSHARE_MSG_HANDOFF) {
        if (fd >= 0 && g)
            nvshare_gate_on_handoff(g, ev->flags, fd);   /* takes the descriptor */
        else if (fd >= 0)
            close(fd);
        return;
    }
    if (type == NVSHARE_MSG_BURST_PAGE) {
        burst_page(g, fd);
        return;
    }
    if (!g) {
        nvshare_debug("gpu %s: message %u for a GPU this process does not use", ev->gpu_uuid, type);
        if (type == NVSHARE_MSG_LOCK_GRANT || type == NVSHARE_MSG_DROP_LOCK)
            nvshare_outbox_gpu_event(NVSHARE_MSG_LOCK_RELEASED, ev->gpu_uuid, NVSHARE_RELEASE_DROPPED, 0, NULL);
        return;
    }
    switch (type) {
    case NVSHARE_MSG_LOCK_GRANT: nvshare_gate_on_grant(g, ev->flags, ev->switch_ms, ev->bytes); break;
    case NVSHARE_MSG_LOCK_CONTENDED: nvshare_gate_on_contended(g, ev->bytes); break;
    case NVSHARE_MSG_DROP_LOCK: nvshare_gate_on_drop(g, ev->switch_ms, ev->bytes); break;
    case NVSHARE_MSG_PREPARE_SWAP_OUT: nvshare_gate_on_prepare_swap_out(g, ev->bytes); break;
    case NVSHARE_MSG_RESUMED: nvshare_gate_on_resumed(g); break;
    case NVSHARE_MSG_PREFETCH: nvshare_gate_on_prefetch(g, ev->bytes); break;
    default: nvshare_debug("gpu %s: message %u not handled yet", g->uuid, type); break;
    }
}

static const struct nvshare_link_events handlers = {
    .up = link_up,
    .down = link_down,
    .refused = link_refused,
    .gpu_event = gpu_event,
    .request_refused = nvshare_gate_on_request_refused,
};

void nvshare_events_install(void)
{
    nvshare_client_set_events(&handlers);
}
