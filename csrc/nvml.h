/* nvml.h: NVML as a managed job sees it (nvml.c). The dlsym wrappers (hook.c) hand out nvml.c's
 * wrappers for the NVML names it interposes; a program linked to libnvidia-ml gets them by preload.
 */
#ifndef NVSHARE_NVML_H
#define NVSHARE_NVML_H

#pragma GCC visibility push(hidden)

/* The wrapper for an NVML function `name` looked up in `handle` (dlsym), or NULL: not an interposed
 * name, outside a managed job, or `handle` lacks it. Remembers the real function found there. */
void *nvshare_nvml_wrapper(void *handle, const char *name);

#pragma GCC visibility pop

#endif
