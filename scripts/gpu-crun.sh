#!/bin/bash
# crun for the GPU machine, which has no package registry, and the OCI bundle that
# scripts/gpu-slurm-e2e.sh's container mode (E2E_CONTAINER=1) runs a PyTorch training in.
#
#   here:  bash scripts/gpu-crun.sh fetch .crundeb      # apt-get download crun and its libraries
#   there: bash scripts/gpu-crun.sh install .crundeb    # unpack to $CRUN_ROOT (default /opt/crunroot)
#          $CRUN_ROOT/bin/crun --version                 # the wrapper: crun with what the node lacks
#          bash scripts/gpu-crun.sh bundle BUNDLE [RW_DIR ...] [-- RO_DIR ...]
#
# fetch: Debian 12's crun (1.8.1, the one tests/slurm/test_containers.py runs) and every library it
# links, so that `install` finds any the GPU machine (Ubuntu 24.04) lacks; libyajl2 is the usual one.
# install: dpkg -x each package into $CRUN_ROOT, nothing installed on the system; the libraries
# crun cannot find on the node are linked into $CRUN_ROOT/needed, and $CRUN_ROOT/bin/crun runs crun with
# LD_LIBRARY_PATH set to that directory only (the container's processes get config.json's
# environment, not crun's).
# bundle: a `crun spec` bundle whose read-only rootfs is the node's system as an image would carry
# it: /usr, /etc, /opt and the /bin, /sbin, /lib* links or directories, plus the directories of this
# Python and of its torch when they lie elsewhere. Its own PID, mount, IPC, UTS and network
# namespaces (the spec's). /dev and /sys are the node's (rbind: the NVIDIA device files, NVML's
# sysfs), /proc its own, /tmp and /root tmpfs, each RW_DIR a read-write bind and each RO_DIR a read-only
# bind at its own path. Nothing of nvshare-slurm is in it: the hook and the daemon's socket come
# from nvshare-container (slurm/oci.conf.example). The device rule allows every device (crun runs
# with --cgroup-manager=disabled, so Slurm's cgroup, ConstrainDevices included, is what confines).
set -eu
cmd=${1:-}
CRUN_ROOT=${CRUN_ROOT:-/opt/crunroot}
case $cmd in
  fetch)
    dir=${2:?usage: gpu-crun.sh fetch DIR}
    mkdir -p "$dir"
    (cd "$dir" && apt-get download crun libyajl2 libseccomp2 libcap2 libsystemd0 \
      liblzma5 libzstd1 liblz4-1 libgcrypt20 libgpg-error0)
    echo "gpu-crun: fetched $(ls "$dir"/*.deb | wc -l) packages into $dir; carry it to the GPU machine" ;;
  install)
    dir=${2:?usage: gpu-crun.sh install DIR}
    ls "$dir"/crun_*.deb >/dev/null 2>&1 || { echo "gpu-crun: no crun_*.deb in $dir" >&2; exit 1; }
    mkdir -p "$CRUN_ROOT/bin" "$CRUN_ROOT/needed"
    for f in "$dir"/*.deb; do dpkg -x "$f" "$CRUN_ROOT"; done
    # The libraries the node's ld.so does not find for crun, and only those, from the packages.
    rm -f "$CRUN_ROOT"/needed/*
    for so in $(ldd "$CRUN_ROOT/usr/bin/crun" | awk '$2 == "=>" && $3 == "not" {print $1}'); do
      found=$(find "$CRUN_ROOT/usr/lib" "$CRUN_ROOT/lib" -maxdepth 2 -name "$so" 2>/dev/null | head -1)
      [ -n "$found" ] || { echo "gpu-crun: crun needs $so, which neither the node nor $dir has" >&2; exit 1; }
      ln -sf "$found" "$CRUN_ROOT/needed/$so"
    done
    cat > "$CRUN_ROOT/bin/crun" <<WRAP
#!/bin/sh
# crun unpacked by scripts/gpu-crun.sh, with the libraries the node lacks ($(ls "$CRUN_ROOT/needed" | xargs))
LD_LIBRARY_PATH=$CRUN_ROOT/needed exec $CRUN_ROOT/usr/bin/crun "\$@"
WRAP
    chmod 755 "$CRUN_ROOT/bin/crun"
    "$CRUN_ROOT/bin/crun" --version | head -1
    echo "gpu-crun: crun unpacked in $CRUN_ROOT; run it as $CRUN_ROOT/bin/crun" ;;
  bundle)
    bundle=${2:?usage: gpu-crun.sh bundle BUNDLE [RW_DIR ...] [-- RO_DIR ...]}
    shift 2
    CRUN=${CRUN:-$(command -v crun || echo "$CRUN_ROOT/bin/crun")}
    [ -x "$CRUN" ] || { echo "gpu-crun: no crun (install it, or set CRUN)" >&2; exit 1; }
    rm -rf "$bundle"; mkdir -p "$bundle"
    (cd "$bundle" && "$CRUN" spec)
    PY=${PY:-python3}
    "$PY" - "$bundle" "$@" <<'PY'
"""Edit crun spec's config.json into the bundle described at the top of gpu-crun.sh."""
import json
import os
import sys
from pathlib import Path

bundle = Path(sys.argv[1])
rw, ro, into = [], [], None
into = rw
for arg in sys.argv[2:]:
    if arg == "--":
        into = ro
    else:
        into.append(os.path.abspath(arg))
rootfs = bundle / "rootfs"
rootfs.mkdir()
config = json.loads((bundle / "config.json").read_text())
config["process"]["terminal"] = False
config["process"]["cwd"] = "/"
mounts = [m for m in config["mounts"] if m["destination"] in ("/proc",)]


def bind(path: str, mode: str = "ro") -> None:
    mounts.append({"destination": path, "type": "bind", "source": path,
                   "options": ["rbind", mode, "nosuid"] if mode == "ro" else ["rbind", mode]})


system = set()
for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt"):
    host = Path("/") / name
    if host.is_symlink():                 # merged /usr: /bin -> usr/bin
        (rootfs / name).symlink_to(os.readlink(host))
    elif host.is_dir():
        (rootfs / name).mkdir()
        bind(str(host))
        system.add(str(host))
# /dev and /sys as the node has them: the NVIDIA device files (/dev/nvidia0, nvidiactl, nvidia-uvm)
# and the sysfs NVML and CUDA read. /tmp and /root tmpfs, empty as an image's are.
for name in ("dev", "sys", "proc", "tmp", "root"):
    (rootfs / name).mkdir()
mounts.append({"destination": "/dev", "type": "bind", "source": "/dev",
               "options": ["rbind", "rw", "nosuid"]})
mounts.append({"destination": "/sys", "type": "bind", "source": "/sys",
               "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]})
for name in ("tmp", "root"):   # HOME of root's jobs: CUDA's and torch's caches
    mounts.append({"destination": f"/{name}", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777" if name == "tmp" else "mode=700",
                               "size=1g"]})
# The Python that runs the training, and its torch, where they lie outside the system directories
# (a venv, /root/.local): the directories only, never a checkout or /tmp.
extra = set()
try:
    import torch  # noqa: F401
    extra.add(os.path.dirname(os.path.dirname(os.path.realpath(torch.__file__))))
except ImportError:
    pass
extra |= {sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(sys.executable),
          os.path.dirname(os.path.realpath(sys.executable))}
extra |= {p for p in sys.path if "site-packages" in p or "dist-packages" in p}
for path in sorted({os.path.realpath(p) for p in extra if p}):   # parents sort first
    if path == "/" or path == "/tmp" or path.startswith("/tmp/") or not os.path.isdir(path) \
            or any(path == s or path.startswith(s + "/") for s in system):
        continue
    bind(path)
    system.add(path)
for path in ro:
    bind(path)
for path in rw:
    bind(path, "rw")
config["mounts"] = mounts
# No rule of crun's own: with --cgroup-manager=disabled it makes no cgroup, and Slurm's
# (ConstrainDevices) is what confines the devices.
config["linux"]["resources"] = {"devices": [{"allow": True, "access": "rwm"}]}
(bundle / "config.json").write_text(json.dumps(config, indent=2) + "\n")
print(f"gpu-crun: bundle {bundle}: rootfs binds "
      + ", ".join(m["destination"] for m in mounts if m["type"] == "bind"))
PY
    ;;
  *) echo "usage: $0 fetch DIR | install DIR | bundle BUNDLE [RW_DIR ...] [-- RO_DIR ...]" >&2; exit 2 ;;
esac
