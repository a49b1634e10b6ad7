#!/bin/bash
# Run every test tier that can run here, as root on a fresh Debian/Ubuntu machine: unit, C against the
# fake driver, wheel, real Slurm (this machine's, then Slurm 24.11 in a Debian 13 chroot:
# scripts/test-slurm-2411.sh). GPU tests (marker gpu) skip where there is no GPU.
# The tests get their own virtualenv, $NVSHARE_TEST_PREFIX (default /opt/nvshare-test): an editable
# install of this checkout with the test extras. The production prefix (/opt/nvshare) is never touched.
# Slurm and munge come from scripts/install-demo-slurm.sh (apt, only where they are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${NVSHARE_TEST_PREFIX:-/opt/nvshare-test}
[ "$(realpath -m "$PREFIX")" != "$(realpath -m "${NVSHARE_PREFIX:-/opt/nvshare}")" ] \
  || { echo "test.sh: NVSHARE_TEST_PREFIX must not be the production prefix $PREFIX"; exit 1; }
bash scripts/install-demo-slurm.sh
# Real-Slurm tests run the venv's Python as other users too.
# shellcheck source=system-python.sh
. scripts/system-python.sh
NVSHARE_PREFIX=$PREFIX NVSHARE_EDITABLE=1 NVSHARE_EXTRAS=test bash scripts/install.sh
export PATH="$PREFIX/bin:$PATH"
echo "test.sh: every tier here, real Slurm on $(/usr/sbin/slurmd -V 2>/dev/null || echo 'no Slurm')"
# Lint and types first (pyproject.toml's [tool.ruff] and [tool.mypy]), one line each; a tool's own
# report only when it fails. A failure fails the script, after the tiers have still run.
check() {
  local name=$1 out; shift
  if out=$("$@" 2>&1); then
    echo "test.sh: $name: ${out##*$'\n'}"
  else
    printf '%s\n' "$out"
    echo "test.sh: $name: FAILED (its report is above)"
    return 1
  fi
}
rc_lint=0
check "ruff check" "$PREFIX/bin/ruff" check --output-format concise || rc_lint=1
check mypy "$PREFIX/bin/mypy" || rc_lint=1
# An old image for tests/hook/test_glibc_floor.py: a Debian 11 root filesystem (glibc 2.31), made
# once and cached (about 1.5 min); without it that test skips its runs there and says why.
bash scripts/bullseye-root.sh || echo "test.sh: no Debian 11 root filesystem; the old-glibc runs will skip"
rc=0
"$PREFIX/bin/python" -m pytest -p no:cacheprovider -ra "$@" tests || rc=$?
# The real-Slurm tier again on the newest supported Slurm (24.11, Debian 13 in a chroot), so both
# ends of the supported range are tested; NVSHARE_SLURM_2411=0 leaves it out of a quick local run.
rc_2411=0
if [ "${NVSHARE_SLURM_2411:-1}" != 0 ]; then
  bash scripts/test-slurm-2411.sh || rc_2411=$?
else
  echo "test.sh: NVSHARE_SLURM_2411=0: the Slurm 24.11 tier was not run"
fi
[ "$rc_lint" = 0 ] && [ "$rc" = 0 ] && [ "$rc_2411" = 0 ] && exit 0
[ "$rc_lint" = 0 ] || echo "test.sh: FAILED: ruff check or mypy (its report is above pytest's)" >&2
echo "test.sh: FAILED: pytest exit $rc on this machine's Slurm, $rc_2411 on Slurm 24.11" >&2
exit $(( rc != 0 ? rc : rc_2411 != 0 ? rc_2411 : rc_lint ))
