"""nvshare-slurm: GPU sharing for Slurm clusters."""
from pathlib import Path

__version__ = "0.1.0"


def libnvshare_path() -> Path:
    """Where the installed LD_PRELOAD hook lies (built into the wheel beside this package)."""
    return Path(__file__).resolve().parent / "libnvshare.so"
