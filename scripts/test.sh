#!/bin/bash
# Install everything on a fresh Debian/Ubuntu machine (as root) and run every test tier that can run
# here: unit, C against the fake driver, real Slurm. GPU tests (marker gpu) skip where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
NVSHARE_EDITABLE=1 bash scripts/install.sh
PREFIX=${NVSHARE_PREFIX:-/opt/nvshare}
export PATH="$PREFIX/bin:$PATH"
exec "$PREFIX/bin/python" -m pytest -p no:cacheprovider -ra "$@" tests
