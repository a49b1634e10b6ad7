"""Share classes: which jobs keep their speed on a shared GPU (high) and which soak up the rest (low).

A job's class comes from Slurm facts the user cannot change for a running job, through the site's
map (nvshare.yaml `priority_classes`): its QOS, its partition, whether it is an interactive
allocation (salloc, or srun outside a batch script: Slurm's BatchFlag=0), and, only for words the
site lists, its --comment. The first that the map names decides, in that order; else `default`.
The prolog (root) sends the class with the job's registration, so a user's environment or a
client process never chooses it. docs/design-scheduler.md "Priority classes" has the policy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

CLASSES = ("high", "normal", "low")
# Lower ranks go first: the policy compares ranks, never names.
RANK = {name: rank for rank, name in enumerate(CLASSES)}
NORMAL = "normal"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


class ClassMapError(ValueError):
    """A priority_classes map that cannot be used; the message names the entry."""


@dataclass(frozen=True)
class ClassMap:
    qos: dict[str, str] = field(default_factory=dict)
    partition: dict[str, str] = field(default_factory=dict)
    comment: dict[str, str] = field(default_factory=dict)   # words users may put in --comment
    interactive: str = "none"                               # a class, or none: no own class
    default: str = NORMAL

    def as_dict(self) -> dict[str, Any]:
        return {"qos": dict(self.qos), "partition": dict(self.partition),
                "comment": dict(self.comment), "interactive": self.interactive,
                "default": self.default}


@dataclass(frozen=True)
class ShareClass:
    name: str = NORMAL
    reason: str = "default"    # "qos prod", "partition scavenge", "interactive", "comment low"

    def describe(self) -> str:
        return f"{self.name}({self.reason})"


def parse_map(value: Any, where: str) -> ClassMap:
    """A ClassMap from the config's value; ClassMapError naming the bad entry."""
    if value is None:
        return ClassMap()
    if not isinstance(value, dict):
        raise ClassMapError(f"{where}: expected a mapping with qos, partition, comment, "
                            f"interactive, default; got {value!r}")
    unknown = set(value) - {"qos", "partition", "comment", "interactive", "default"}
    if unknown:
        raise ClassMapError(f"{where}: unknown key {sorted(map(str, unknown))[0]!r}")
    maps: dict[str, dict[str, str]] = {}
    for key in ("qos", "partition", "comment"):
        entries = value.get(key) or {}
        if not isinstance(entries, dict):
            raise ClassMapError(f"{where}.{key}: expected a mapping of name: class, got {entries!r}")
        maps[key] = {}
        for name, cls in entries.items():
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise ClassMapError(f"{where}.{key}: {name!r} is not a Slurm {key} name")
            maps[key][name] = _class(cls, f"{where}.{key}.{name}")
    interactive = value.get("interactive", "none")
    if str(interactive).strip().lower() != "none":
        interactive = _class(interactive, f"{where}.interactive")
    else:
        interactive = "none"
    default = _class(value.get("default", NORMAL), f"{where}.default")
    return ClassMap(maps["qos"], maps["partition"], maps["comment"], interactive, default)


def _class(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.strip().lower() not in RANK:
        raise ClassMapError(f"{where}: {value!r} is not one of {', '.join(CLASSES)}")
    return value.strip().lower()


def classify(class_map: ClassMap, qos: str = "", partition: str = "", interactive: bool = False,
             comment: str = "") -> ShareClass:
    """The job's class and why. A job on several partitions (a list) takes the first mapped one."""
    if qos and qos in class_map.qos:
        return ShareClass(class_map.qos[qos], f"qos {qos}")
    for part in (p for p in partition.split(",") if p):
        if part in class_map.partition:
            return ShareClass(class_map.partition[part], f"partition {part}")
    if interactive and class_map.interactive != "none":
        return ShareClass(class_map.interactive, "interactive")
    word = comment.strip()
    if word and word in class_map.comment:
        return ShareClass(class_map.comment[word], f"comment {word}")
    return ShareClass(class_map.default, "default")
