"""nvshare-slurm: GPU sharing for Slurm clusters."""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

__version__ = "0.1.0"


def libnvshare_file() -> str:
    """Where the installed LD_PRELOAD hook lies (built into the wheel beside this package). Without
    pathlib: every task's TaskProlog imports this package."""
    return os.path.join(os.path.dirname(os.path.realpath(__file__)), "libnvshare.so")


def libnvshare_path() -> Path:
    from pathlib import Path
    return Path(libnvshare_file())
