/* hostpin.h: pinned host memory for swap copies (hostpin.c). */
#ifndef NVSHARE_HOSTPIN_H
#define NVSHARE_HOSTPIN_H

#include <stddef.h>

#include "cuda_subset.h"

#pragma GCC visibility push(hidden)

/* A pinned host buffer of `size` bytes, for a context current on this thread; *mapped says how it was
 * made (pass it back to nvshare_host_unpin). CUDA_SUCCESS or the driver's error. */
CUresult nvshare_host_pin(void **out, size_t size, int *mapped);
void nvshare_host_unpin(void *p, size_t size, int mapped);

#pragma GCC visibility pop

#endif
