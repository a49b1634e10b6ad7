/* events.h: what the daemon says, handed to the part it concerns (events.c): lock events to the gate,
 * burst pages to burst.c, a new connection to the gate, memory accounting and the demand sampler.
 * The one place above the gate that client.c's reader reaches, through the handlers it registers.
 */
#ifndef NVSHARE_EVENTS_H
#define NVSHARE_EVENTS_H

/* Registers the handlers with client.c (hook.c's constructor). */
void nvshare_events_install(void);

#endif
