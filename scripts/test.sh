#!/bin/bash
# Run every test tier that can run here, as root on a fresh Debian/Ubuntu machine: unit, C against the
# fake driver, wheel, real Slurm. GPU tests (marker gpu) skip where there is no GPU.
# The tests get their own virtualenv, $NVSHARE_TEST_PREFIX (default /opt/nvshare-test): an editable
# install of this checkout with the test extras. The production prefix (/opt/nvshare) is never touched.
# Slurm and munge come from scripts/install-demo-slurm.sh (apt, only where they are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${NVSHARE_TEST_PREFIX:-/opt/nvshare-test}
[ "$(realpath -m "$PREFIX")" != "$(realpath -m "${NVSHARE_PREFIX:-/opt/nvshare}")" ] \
  || { echo "test.sh: NVSHARE_TEST_PREFIX must not be the production prefix $PREFIX"; exit 1; }
bash scripts/install-demo-slurm.sh
# Real-Slurm tests run the venv's Python as other users too: prefer the system's Python (a pyenv
# one under /root is not theirs to run). NVSHARE_VENV_PYTHON still picks another.
if [ -z "${NVSHARE_VENV_PYTHON:-}" ] \
    && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  export NVSHARE_VENV_PYTHON=/usr/bin/python3
fi
NVSHARE_PREFIX=$PREFIX NVSHARE_EDITABLE=1 NVSHARE_EXTRAS=test bash scripts/install.sh
export PATH="$PREFIX/bin:$PATH"
exec "$PREFIX/bin/python" -m pytest -p no:cacheprovider -ra "$@" tests
