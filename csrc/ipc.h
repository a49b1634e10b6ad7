/* ipc.h: CUDA IPC of swappable memory (ipc.c): the nvshare handle, the exporter's descriptor server,
 * the importer's fetch and map. Calls swap.c, gpus.c, driver.c and env.c.
 */
#ifndef NVSHARE_IPC_H
#define NVSHARE_IPC_H

#include <stdint.h>

#include "gpus.h"

/* Exports the swappable allocation that ptr lies in (the caller inside g's gate): an nvshare handle. */
CUresult nvshare_ipc_export(struct nvshare_gpu *g, CUdeviceptr ptr, CUipcMemHandle *handle,
                            uint64_t *newly_fixed);
/* The allocation at base is being freed: its handles no longer open. */
void nvshare_ipc_forget(CUdeviceptr base);
int nvshare_ipc_is_ours(const CUipcMemHandle *handle);
CUresult nvshare_ipc_open(CUdeviceptr *dptr, const CUipcMemHandle *handle, unsigned int flags);
/* 1 when dptr was opened by nvshare_ipc_open (its result in *rc); 0: the driver's. */
int nvshare_ipc_close(CUdeviceptr dptr, CUresult *rc);
void nvshare_ipc_after_fork(void);

#endif
