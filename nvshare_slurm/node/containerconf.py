"""The container runtimes' files that nvshare-node-config prints (and slurm/ ships, with the prefix
/opt/nvshare): Slurm's oci.conf, the enroot hook for pyxis, and apptainer.conf's bind paths.

Each mounts libnvshare.so and the daemon's socket directory into the container at their paths on
the node and gives it the TaskProlog's variables; nvshare-container (container.py) does the work
for Slurm OCI and enroot. tests/unit/test_nodeconfig.py checks that slurm/oci.conf.example and
slurm/enroot-hook are these texts for /opt/nvshare/bin.
"""
from __future__ import annotations

ENROOT_HOOK = "/etc/enroot/hooks.d/nvshare.sh"
CRUN = "/usr/bin/crun --rootless=true --root=/tmp/ --cgroup-manager=disabled"
RUNC = "/usr/sbin/runc --rootless=true --root=/tmp/"
CONTAINER_ID = "%n.%u.%j.%s.%t"


def oci_conf(bin_dir: str) -> list[str]:
    wrap = f"{bin_dir}/nvshare-container oci %j %b --"
    return [
        "# oci.conf for nvshare-slurm: Slurm's OCI containers (srun/sbatch --container=BUNDLE) get",
        "# the hook. Goes beside slurm.conf on every node (Slurm reads it from slurm.conf's",
        "# directory). Tested with crun on Slurm 22.05 and 24.11 (docs/admin-guide.md",
        '# "Containers").',
        "#",
        "# RunTimeRun goes through nvshare-container, which adds to the bundle's config.json what",
        "# the TaskProlog's exports alone do not bring into a container: read-only bind mounts of",
        "# libnvshare.so and of the daemon's socket directory, at their paths on the node, and the",
        "# TaskProlog's variables (LD_PRELOAD, CUDA_VISIBLE_DEVICES, NVSHARE_*), asked of",
        "# nvshare-scheduler for job %j. A job with no nvshare GPUs on the node runs unchanged; a",
        "# managed job whose container cannot get the hook does not start, and its output says why.",
        "# Its other arguments are Slurm's documented crun lines. crun's",
        "# --cgroup-manager=disabled keeps the container in the job step's cgroup",
        "# (proctrack/cgroup), where Slurm accounts and ends it, and by which nvshare-scheduler",
        "# knows a process of the container's own PID namespace as the job's: a container moved to",
        '# a cgroup of its own is refused (nvshare-status shows it under "Refused").',
        "# Only RunTimeRun is used (no RunTimeCreate/RunTimeStart): one command per task.",
        f'RunTimeQuery="{CRUN} state {CONTAINER_ID}"',
        f'RunTimeKill="{CRUN} kill -a {CONTAINER_ID}"',
        f'RunTimeDelete="{CRUN} delete --force {CONTAINER_ID}"',
        f'RunTimeRun="{wrap} {CRUN} run --bundle %b {CONTAINER_ID}"',
        "#",
        "# runc instead of crun (not tested by nvshare-slurm's CI): these four lines in place of",
        "# the four above. runc has no --cgroup-manager=disabled: a container it moves to a cgroup",
        "# of its own is refused.",
        f'#RunTimeQuery="{RUNC} state {CONTAINER_ID}"',
        f'#RunTimeKill="{RUNC} kill -a {CONTAINER_ID}"',
        f'#RunTimeDelete="{RUNC} delete --force {CONTAINER_ID}"',
        f'#RunTimeRun="{wrap} {RUNC} run {CONTAINER_ID} -b %b"',
    ]


def enroot_hook(bin_dir: str) -> list[str]:
    return [
        "#!/bin/bash",
        "# nvshare-slurm's enroot hook, for pyxis and enroot: mode 0755 on every node. enroot runs",
        "# it on the node before the container starts, with the job's environment (pyxis passes",
        "# SLURM_JOB_ID). For a job with nvshare GPUs on this node it appends to $ENROOT_MOUNTS",
        "# read-only bind mounts of libnvshare.so and of the daemon's socket directory, at their",
        "# paths on the node (after enroot's own mounts, its tmpfs on /tmp and /var/run included),",
        "# and to $ENROOT_ENVIRON the TaskProlog's variables (LD_PRELOAD, CUDA_VISIBLE_DEVICES,",
        "# NVSHARE_*). Nothing for other containers; a managed job's container that cannot get the",
        "# hook does not start.",
        "set -euo pipefail",
        'if [ -z "${SLURM_JOB_ID-}" ]; then',
        "    exit 0",
        "fi",
        f"exec {bin_dir}/nvshare-container enroot",
    ]


def apptainer_conf(hook: str, socket_dir: str) -> list[str]:
    return [
        "# Apptainer (not tested by nvshare-slurm's CI): the hook of this installation and the",
        "# daemon's socket directory in every container, at their paths on the node. The",
        "# TaskProlog's variables reach the container with the rest of the task's environment;",
        "# --cleanenv drops them: such a job passes them on, e.g.",
        "# --env LD_PRELOAD=$LD_PRELOAD,NVSHARE_SOCKET=$NVSHARE_SOCKET,... (or APPTAINERENV_*).",
        f"bind path = {hook}",
        f"bind path = {socket_dir}",
    ]
