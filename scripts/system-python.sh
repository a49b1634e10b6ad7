# Sourced by demo.sh and test.sh before scripts/install.sh: jobs run the venv's Python as their users
# (the TaskProlog), so make the venv from the system's Python when it is 3.10 or newer; root's
# `python3` may be one they cannot run (pyenv's under /root), which install.sh refuses.
# NVSHARE_VENV_PYTHON, when set, still picks another.
if [ -z "${NVSHARE_VENV_PYTHON:-}" ] \
    && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  export NVSHARE_VENV_PYTHON=/usr/bin/python3
fi
