"""One logger setup: every line names its component ("nvshare-scheduler: gpu GPU-1a2b: job 12 step 0: ...")."""
from __future__ import annotations

import logging
import sys


def setup(component: str, level: str = "info", stream=None) -> logging.Logger:
    logger = logging.getLogger("nvshare")
    logger.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {component}: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


def get() -> logging.Logger:
    return logging.getLogger("nvshare")
