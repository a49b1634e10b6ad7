"""Who held which GPU when, read from nvshare-scheduler's debug log (its "lock granted", "lock
released" and "client disconnected" lines), and what the proofs ask of it: turns of different jobs
that overlapped on a GPU, hand-overs between jobs, and how much of a gang's turn held all its GPUs."""
from __future__ import annotations

import re
from datetime import datetime

# A grant or release names its GPU; a disconnect names none and ends the client's every turn.
LINE = re.compile(r"^(\S+ \S+) nvshare-scheduler: (?:gpu (\S+): )?job (\d+) step (\S+) pid (\d+): "
                  r"(lock granted|lock released|client disconnected)")


def turns_from_log(text: str, uuid_index: dict[str, int]) -> list[dict]:
    """Who held which GPU when: [{gpu, job, pid, start, end}], a job's back-to-back turns on a GPU
    (an idle release and re-grant within 50 ms) merged into one, sorted by start."""
    holding, raw = {}, []
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        t = datetime.strptime(m[1].replace(",", "."), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        if m[2] is None:
            ended = [w for w in holding if w[1:] == (m[3], m[5])] if m[6] == "client disconnected" else []
        else:
            who = (uuid_index.get(m[2], -1), m[3], m[5])
            if m[6] == "lock granted":
                holding.setdefault(who, t)
            ended = [who] if m[6] != "lock granted" and who in holding else []
        for w in ended:
            raw.append({"gpu": w[0], "job": w[1], "pid": w[2], "start": holding.pop(w), "end": t})
    # In each GPU's order of grants: a job's turn is merged only with its own turn just before,
    # never across another job's turn in between.
    raw.sort(key=lambda r: (r["gpu"], r["start"]))
    merged: list[dict] = []
    for r in raw:
        last = merged[-1] if merged else None
        same = last is not None and (last["gpu"], last["job"]) == (r["gpu"], r["job"])
        if same and r["start"] - last["end"] < 0.05:
            last["end"] = max(last["end"], r["end"])
        else:
            merged.append(dict(r))
    return sorted(merged, key=lambda r: (r["start"], r["gpu"]))


def overlaps(turns: list[dict], jobs: set[str], slack: float = 0.02) -> int:
    """Turns of two of these jobs on one GPU that overlapped by more than the slack (a holder
    that exits is logged gone just after its successor's grant)."""
    n = 0
    for gpu in {t["gpu"] for t in turns}:
        mine = [t for t in turns if t["gpu"] == gpu and t["job"] in jobs]
        for i, a in enumerate(mine):
            for b in mine[i + 1:]:
                shared = min(a["end"], b["end"]) - max(a["start"], b["start"])
                if a["job"] != b["job"] and shared > slack:
                    n += 1
    return n


def switches(turns: list[dict], jobs: set[str], gpu: int) -> int:
    seq = [t["job"] for t in turns if t["gpu"] == gpu and t["job"] in jobs]
    return sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)


def gang_together(turns: list[dict], job: str, gpus: list[int]) -> float:
    """The share of the job's time on a GPU during which it held all its GPUs at once: the least
    over its GPUs (a rank that held one GPU while its peer was shut out of another lowers it)."""
    def spans(g):
        return [(t["start"], t["end"]) for t in turns if t["gpu"] == g and t["job"] == job]
    shares = []
    for first in gpus:
        total = sum(e - s for s, e in spans(first))
        if total <= 0:
            return 0.0
        covered = 0.0
        for s, e in spans(first):
            piece = [(s, e)]
            for g in gpus:
                if g != first:
                    piece = [(max(a, c), min(b, d)) for a, b in piece for c, d in spans(g)
                             if min(b, d) > max(a, c)]
            covered += sum(b - a for a, b in piece)
        shares.append(covered / total)
    return min(shares)


def timeline_text(turns: list[dict], names: dict[str, str]) -> str:
    if not turns:
        return "(no lock grants in the scheduler's log)\n"
    t0 = turns[0]["start"]
    return "".join(f"{t['start'] - t0:9.3f} s .. {t['end'] - t0:9.3f} s  GPU {t['gpu']}  "
                   f"job {t['job']} ({names.get(t['job'], '?')}, pid {t['pid']}, "
                   f"{(t['end'] - t['start']) * 1000:8.1f} ms)\n" for t in turns)
