"""TaskProlog start-up: what `srun -n N` pays per task before the task starts.

Starts nvshare-scheduler (bench_scheduler.start_daemon: 8 configured GPUs), registers a job of this
user, then runs the installed `nvshare-taskprolog` entry point against it --runs times, interleaved
with a bare `<the entry point's interpreter> -c pass` (same interpreter, same site-packages), so that
the load of a shared machine falls on both alike. Each TaskProlog run must print the job's exports.
The entry point imports this checkout (PYTHONPATH), compiled to bytecode first as pip would at
install. With --ref REF it also times the TaskProlog of a git ref (e.g. main before the fast path),
from a temporary copy of that tree, in the same rounds (--ref again: another ref, e.g. the commits
before and after a change, both away from uncommitted work in the checkout).

With --site it also times a site's own TaskProlog (a two-line sh script) alone and chained by
nvshare-taskprolog (config site_task_prolog), which starts it before asking the daemon; chained
with the last --ref's tree, else the checkout's.

Also prints the heaviest imports of one run (`-X importtime`) of each, and, with --write, records
the numbers in docs/benchmarks.md ("## TaskProlog start-up").

    python bench/bench_taskprolog.py [--runs 30] [--ref e22c5a0] [--site] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_scheduler import start_daemon
from docsection import replace_section
from nvshare_slurm.wire.client import Client

REPO = Path(__file__).resolve().parent.parent
JOB_ID = 4242
# Modules the fast path must not load; a run that loads them is reported.
SLOW = ("cffi", "pycparser", "yaml")


def entry_point() -> tuple[Path, str]:
    """The installed nvshare-taskprolog and the interpreter its #! line names."""
    found = shutil.which("nvshare-taskprolog") or str(Path(sys.executable).parent / "nvshare-taskprolog")
    script = Path(found)
    if not script.is_file():
        raise SystemExit("nvshare-taskprolog is not installed (pip install -e . into this venv)")
    interpreter = script.read_text().splitlines()[0].removeprefix("#!").strip()
    return script, interpreter


def tree_of(ref: str, into: Path) -> Path:
    """A copy of the package as of a git ref, with its header where proto.py looks for it."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "nvshare_slurm", "csrc"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    hook = REPO / "nvshare_slurm" / "libnvshare.so"
    if hook.exists():
        shutil.copy(hook, into / "nvshare_slurm" / "libnvshare.so")
    return into


def compile_tree(interpreter: str, root: Path) -> None:
    subprocess.run([interpreter, "-m", "compileall", "-q", str(root / "nvshare_slurm")],
                   check=True, stdout=subprocess.DEVNULL)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {out.returncode}: {out.stderr}")
    return elapsed, out.stdout


def heaviest_imports(interpreter: str, argv: list[str], env: dict[str, str],
                     top: int = 6) -> tuple[list[str], list[str]]:
    """The `top` slowest of our imports and cffi's/yaml's in one run (cumulative), and which of
    cffi, pycparser and yaml it loaded."""
    err = subprocess.run([interpreter, "-X", "importtime"] + argv, env=env, capture_output=True,
                         text=True).stderr
    rows = []
    for line in err.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        rows.append((int(parts[1]), parts[2].strip()))
    rows.sort(reverse=True)
    shown = [f"{name} {cumulative / 1000:.1f} ms" for cumulative, name in rows
             if name.split(".")[0] in ("nvshare_slurm",) + SLOW][:top]
    loaded = sorted({name.split(".")[0] for _, name in rows if name.split(".")[0] in SLOW})
    return shown, loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--ref", action="append", default=[],
                        help="also time the TaskProlog of this git ref (e.g. main); repeatable")
    parser.add_argument("--site", action="store_true",
                        help="also time a site TaskProlog alone and chained (site_task_prolog)")
    parser.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    args = parser.parse_args()

    script, interpreter = entry_point()
    work = Path(tempfile.mkdtemp(prefix="nvs-tp-", dir="/tmp"))
    daemon, sock = start_daemon(work / "d")
    try:
        Client(sock).register_job(JOB_ID, uid=os.getuid(), gid=os.getgid(), slots=1)
        base_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("NVSHARE_", "SLURM", "PYTHON"))}
        base_env.update(SLURM_JOB_ID=str(JOB_ID), NVSHARE_CONFIG=str(work / "d" / "nvshare.yaml"))
        trees = {"this checkout": REPO}
        for ref in args.ref:
            trees[ref] = tree_of(ref, Path(tempfile.mkdtemp(dir=work)))
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([interpreter, "-c", "pass"], dict(base_env, PYTHONPATH=str(REPO)))}
        for label, root in trees.items():
            compile_tree(interpreter, root)
            commands[f"taskprolog ({label})"] = ([str(script)], dict(base_env, PYTHONPATH=str(root)))
        if args.site:
            site = work / "site-taskprolog"
            site.write_text("#!/bin/sh\necho export SITE_BENCH=1\n")
            site.chmod(0o755)
            chained = work / "d" / "chained.yaml"
            chained.write_text((work / "d" / "nvshare.yaml").read_text()
                               + f"site_task_prolog: {site}\n")
            label = args.ref[-1] if args.ref else "this checkout"
            commands["site TaskProlog alone (sh)"] = ([str(site)], base_env)
            commands[f"taskprolog ({label}) + site TaskProlog"] = (
                [str(script)], dict(base_env, PYTHONPATH=str(trees[label]),
                                    NVSHARE_CONFIG=str(chained)))
        for label, (argv, env) in commands.items():      # warm the page cache once
            _, out = timed(argv, env)
            if label.startswith("taskprolog") and f"export NVSHARE_JOB_ID={JOB_ID}" not in out:
                raise SystemExit(f"{label}: no exports for the registered job:\n{out}")
            if "site" in label and "export SITE_BENCH=1" not in out:
                raise SystemExit(f"{label}: no site TaskProlog output:\n{out}")
        samples: dict[str, list[float]] = {label: [] for label in commands}
        for _ in range(args.runs):
            for label, (argv, env) in commands.items():
                samples[label].append(timed(argv, env)[0])
        imports = {label: heaviest_imports(interpreter, argv, env) for label, (argv, env) in commands.items()
                   if label.startswith("taskprolog")}
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(samples["python -c pass"])
    rows = []
    for label, values in samples.items():
        median = statistics.median(values)
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        extra = f"+{(median - base) * 1000:.1f} ms" if label.startswith("taskprolog") else ""
        rows.append(f"| {label} | {median * 1000:.1f} ms | {p90 * 1000:.1f} ms | {extra} |")
    table = "\n".join(["| command | median | p90 | over `-c pass` |", "|---|---|---|---|"] + rows)
    lines = [table, ""]
    for label, (shown, loaded) in imports.items():
        lines.append(f"- {label}, heaviest of its imports (`-X importtime`, cumulative): "
                     + ", ".join(shown) + "; cffi/yaml loaded: " + (", ".join(loaded) or "none"))
    result = "\n".join(lines)
    print(result)
    if args.write:
        date = datetime.date.today().isoformat()
        cores = os.cpu_count()
        text = (f"## TaskProlog start-up\n\nMeasured {date} with `python bench/bench_taskprolog.py "
                f"--runs {args.runs}{''.join(' --ref ' + ref for ref in args.ref)}"
                f"{' --site' if args.site else ''} --write` on a "
                f"{cores}-core machine ({platform.machine()}, Python {platform.python_version()}) "
                "shared with another engineer's test runs: medians of interleaved runs, so that "
                "the load falls on each command alike, with the p90 beside them. Slurm runs the "
                "TaskProlog once per task (`srun -n 64`: 64 times), as the job's user, here against "
                "a running nvshare-scheduler with the job registered (the fast path: a plain "
                "nvshare.yaml, the placement over the socket). The entry point is the installed "
                "`nvshare-taskprolog` script with the tree under test on PYTHONPATH, compiled to "
                "bytecode as pip does at install; `-c pass` runs the same interpreter and "
                "site-packages. Target: within 15 ms of `-c pass`."
                + (" With --site, a site's own TaskProlog (`#!/bin/sh` and one echo) alone, and "
                   "chained by nvshare-taskprolog (site_task_prolog), which starts it before it "
                   "asks the daemon." if args.site else "") + "\n\n" + result + "\n")
        replace_section(REPO / "docs" / "benchmarks.md", "TaskProlog start-up", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
