#!/bin/bash
# Prepare the GPU machine (no network, Slurm not installed) for tier-4 tests and benchmarks:
#   . scripts/gpu-setup.sh
# Installs the wheels of a carried .whl/ folder, if any (for a Python that lacks a dependency), and
# expects, for Slurm, .slurmdeb/ (see ../shared/tools/gpu-machine-slurm.sh). Builds libnvshare.so
# in place.
set -e
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
python3 setup.py -q build_ext --inplace >/tmp/nvshare-build.log 2>&1 || { cat /tmp/nvshare-build.log; false; }
make -s -C tests/c >/dev/null
export PYTHONUNBUFFERED=1
echo "gpu-setup: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1); hook $(ls nvshare_slurm/libnvshare.so)"
set +e
