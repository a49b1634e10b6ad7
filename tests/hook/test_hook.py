"""libnvshare.so against the fake CUDA driver (tests/c) and the real nvshare-scheduler.

Each test runs tests/c/build/nvtest under LD_PRELOAD, the way a job process runs, and judges from
what a user would see: which library answers a CUDA call, when kernels ran (the fake driver's trace
of "pid gpu start_ns end_ns"), what cuMemAlloc and cuMemGetInfo return, whether the program finishes.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import time

import pytest

from helpers_hook import (BUILD, REPO, GPU0, GPU1, Job, finish, overlaps, read_trace, run_nvtest,
                          start_nvtest, whois)


# ---- interposition ------------------------------------------------------------------------------

WRAPPED = {"cuInit", "cuCtxCreate", "cuLaunchKernel", "cuLaunchKernelEx", "cuMemAlloc",
           "cuMemAllocPitch", "cuMemFree", "cuMemGetInfo", "cuMemcpyHtoD", "cuMemcpyDtoH",
           "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap"}


# csrc/devices.c: a GPU's device file denied by the job's device cgroup comes from the daemon.
OPEN_FAMILY = {"open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2",
               "__openat64_2", "fopen", "fopen64"}


# csrc/nvml.c: NVML as the job sees it, the names of its dlsym table.
NVML = set(re.findall(r'\{"(nvml\w+)", R_', (REPO / "csrc" / "nvml.c").read_text()))


def test_exported_symbols_are_exactly_the_list(hook_lib):
    listed = subprocess.run([str(BUILD / "list_symbols")], capture_output=True, text=True,
                            check=True).stdout.split()
    assert len(listed) == len(set(listed)), "a symbol is listed twice in csrc/hook_symbols.h"
    nm = subprocess.run(["nm", "-D", "--defined-only", str(hook_lib)], capture_output=True,
                        text=True, check=True).stdout
    exported = {line.split()[-1] for line in nm.splitlines() if line.split()[1] in "TtWiV"}
    names = {e.split("@")[0] for e in exported}
    assert names - {"dlsym"} - OPEN_FAMILY - NVML == set(listed)
    assert OPEN_FAMILY <= names
    assert len(NVML) == 18 and {n for n in names if n.startswith("nvml")} == NVML
    if platform.machine() == "x86_64":
        assert {"dlsym@@GLIBC_2.34", "dlsym@GLIBC_2.2.5"} <= exported
        # The driver's references name the C library's versions (open64@GLIBC_2.2.5): only a
        # definition of that version takes them (csrc/devices.c).
        assert {"open@@GLIBC_2.2.5", "open64@@GLIBC_2.2.5", "openat@@GLIBC_2.4",
                "__open_2@@GLIBC_2.7", "fopen@@GLIBC_2.2.5"} <= exported


@pytest.mark.parametrize("via", ["link", "dlsym", "dlsym_old", "procaddr", "procaddr_pt"])
def test_every_route_reaches_the_wrappers(hook_lib, via):
    if via == "dlsym_old" and platform.machine() != "x86_64":
        pytest.skip("dlsym@GLIBC_2.2.5 exists on x86-64 only")
    out = run_nvtest(hook_lib, ["init", "ctx:0", "whois", "launch:100:2", "sync", "copy"], via=via)
    assert out.returncode == 0, out.stdout + out.stderr
    found = whois(out.stdout)
    for name in WRAPPED:
        assert found[name][0] == "libnvshare.so", f"{name} via {via}: {found[name]}"
    # Functions the hook does not wrap still come from the driver.
    assert found["cuMemSetAccess"][0] == "libcuda.so.1"
    assert "copy ok" in out.stdout
    if via == "procaddr_pt":
        assert found["cuLaunchKernel"][1] == "cuLaunchKernel_ptsz"
        assert found["cuMemcpyHtoD"][1] == "cuMemcpyHtoD_v2_ptds"
    else:
        assert found["cuLaunchKernel"][1] == "cuLaunchKernel"
        assert found["cuMemAlloc"][1] == "cuMemAlloc_v2"


def test_without_the_hook_calls_go_to_the_driver(hook_lib):
    """The control for the test above: the same program alone talks to libcuda.so.1."""
    out = run_nvtest(None, ["init", "ctx:0", "whois"], via="procaddr")
    assert out.returncode == 0, out.stderr
    assert all(lib == "libcuda.so.1" for lib, _ in whois(out.stdout).values())


@pytest.mark.parametrize("query,expected", [
    ("cuGetProcAddress:12040:0", "cuGetProcAddress_v2"),
    ("cuGetProcAddress:11030:0", "cuGetProcAddress"),
    ("cuMemAlloc:12040:0", "cuMemAlloc_v2"),
    ("cuMemAlloc:3000:0", None),  # the driver's v1 (not in the fake): nothing to hand out
    ("cuLaunchKernel:12040:2", "cuLaunchKernel_ptsz"),
    ("cuLaunchKernel:12040:1", "cuLaunchKernel"),
    ("cuMemcpyHtoD:12040:2", "cuMemcpyHtoD_v2_ptds"),
    ("cuMemAllocAsync:12040:2", "cuMemAllocAsync_ptsz"),
    ("cuCtxCreate:12050:0", "cuCtxCreate_v4"),
    ("cuCtxCreate:11040:0", "cuCtxCreate_v3"),
    ("cuCtxCreate:11000:0", "cuCtxCreate_v2"),
    ("cuLaunchKernelEx:12040:0", "cuLaunchKernelEx"),
    # CUDA 13's entry points (issue 10): the driver hands these out for cudaVersion 13000
    ("cuMemcpyBatchAsync:13000:0", "cuMemcpyBatchAsync_v2"),
    ("cuMemcpyBatchAsync:13000:2", "cuMemcpyBatchAsync_v2_ptsz"),
    ("cuMemPrefetchBatchAsync:13000:0", "cuMemPrefetchBatchAsync"),
    ("cuMemDiscardBatchAsync:13000:0", "cuMemDiscardBatchAsync"),
    ("cuGraphUpload:13000:0", "cuGraphUpload"),
    ("cuStreamBeginCapture:13000:0", "cuStreamBeginCapture_v2"),
    ("cuMemAllocFromPoolAsync:13000:0", "cuMemAllocFromPoolAsync"),
    ("cuCtxSynchronize:13000:0", "cuCtxSynchronize_v2"),   # counted (demand, not idle), never gated
    ("cuCtxSynchronize:12040:0", "cuCtxSynchronize"),
])
def test_cuGetProcAddress_hands_out_the_matching_wrapper(hook_lib, query, expected):
    out = run_nvtest(hook_lib, ["init", f"procaddr:{query}"], via="procaddr")
    assert out.returncode == 0, out.stdout + out.stderr
    (label, (lib, sym)), = whois(out.stdout).items()
    if expected is None:
        assert lib == "none" and "rc=500" in label
    else:
        assert (lib, sym) == ("libnvshare.so", expected)
        assert "rc=0" in label


def test_unwrapped_names_resolve_to_the_driver(hook_lib):
    out = run_nvtest(hook_lib, ["init", "procaddr:cuDeviceGet:12040:0", "procaddr:cuNoSuchThing:12040:0"],
                     via="procaddr")
    found = whois(out.stdout)
    assert found["cuDeviceGet@12040/0 rc=0"] == ("libcuda.so.1", "cuDeviceGet")
    assert found["cuNoSuchThing@12040/0 rc=500"][0] == "none"


def test_outside_a_job_the_hook_only_passes_through(hook_lib, tmp_path):
    trace = tmp_path / "trace"
    out = run_nvtest(hook_lib, ["init", "ctx:0", "launch:1000:3", "sync", "alloc:1048576", "meminfo",
                                "vm:4194304"],
                     env={"FAKE_CUDA_TRACE": str(trace)})
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert "meminfo free=17178820608 total=17179869184" in out.stdout
    assert "vm rc=0 data ok" in out.stdout
    assert len(read_trace(trace)) == 3


# ---- with the daemon ----------------------------------------------------------------------------

@pytest.fixture
def concurrent(scheduler_factory):
    return scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                             switch_time_fixed=30.0)


def test_two_processes_on_one_gpu_never_overlap(hook_lib, concurrent, tmp_path, procs):
    trace = tmp_path / "trace"
    jobs = [Job(concurrent, 101, trace, gpu_index=[0]), Job(concurrent, 102, trace, gpu_index=[0])]
    for job in jobs:
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "burst:20000:8:3"], job.env))
    for p in procs:
        finish(p)
    rows = read_trace(trace)
    assert len({r[0] for r in rows}) == 2 and len(rows) == 16
    assert overlaps(rows, GPU0) == []


def test_processes_on_different_gpus_run_together(hook_lib, concurrent, tmp_path, procs):
    trace = tmp_path / "trace"
    jobs = [Job(concurrent, 111, trace, gpu_index=[0]), Job(concurrent, 112, trace, gpu_index=[1])]
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:400000", "sync"], jobs[0].env))
    procs.append(start_nvtest(hook_lib, ["init", "ctx:1", "launch:400000", "sync"], jobs[1].env))
    for p in procs:
        finish(p)
    rows = read_trace(trace)
    a, b = sorted(rows, key=lambda r: r[1])
    assert a[1] == GPU0 and b[1] == GPU1
    assert a[2] < b[3] and b[2] < a[3], "the two GPUs were not used at the same time"


def test_waiters_get_the_gpu_in_arrival_order(hook_lib, concurrent, tmp_path, procs):
    trace = tmp_path / "trace"
    jobs = [Job(concurrent, 120 + i, trace, gpu_index=[0]) for i in range(3)]
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:400000", "sync"], jobs[0].env))
    time.sleep(0.15)
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:50000", "sync"], jobs[1].env))
    time.sleep(0.15)
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:50000", "sync"], jobs[2].env))
    for p in procs:
        finish(p)
    rows = read_trace(trace)
    order = [r[0] for r in sorted(rows, key=lambda r: r[2])]
    assert order == [p.pid for p in procs]
    assert overlaps(rows, GPU0) == []


def test_an_idle_holder_hands_over_within_milliseconds(hook_lib, concurrent, tmp_path, procs):
    """A bursty holder (2 ms of GPU work, then 60 ms of host work) gives the GPU to a waiter long
    before its 30 s switch interval ends."""
    trace = tmp_path / "trace"
    bursty = Job(concurrent, 131, trace, gpu_index=[0])
    steady = Job(concurrent, 132, trace, gpu_index=[0])
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "burst:2000:25:60"], bursty.env))
    time.sleep(0.3)
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:10000:3", "sync"], steady.env))
    for p in procs:
        finish(p)
    rows = read_trace(trace)
    assert overlaps(rows, GPU0) == []
    steady_first = min(r[2] for r in rows if r[0] == procs[1].pid)
    before = [r[3] for r in rows if r[0] == procs[0].pid and r[3] <= steady_first]
    assert before, "the steady process ran before the bursty one"
    gap_ms = (steady_first - max(before)) / 1e6
    assert gap_ms < 250, f"the waiter started {gap_ms:.1f} ms after the holder's last kernel"


def test_mem_limit_and_the_jobs_view_of_memory(hook_lib, scheduler, tmp_path):
    job = Job(scheduler, 141, tmp_path / "trace", gpu_index=[0], NVSHARE_MEM_LIMIT="1G")
    mib = 1 << 20
    out = run_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{512 * mib}", "meminfo", f"alloc:{600 * mib}",
                                "allocpitch:1048576:600", "freeall", "meminfo", f"alloc:{900 * mib}"],
                     env=job.env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"alloc:{512 * mib}" not in lines and f"alloc {512 * mib} rc=0" in lines
    assert f"meminfo free={512 * mib} total={1024 * mib}" in lines
    assert f"alloc {600 * mib} rc=2" in lines  # CUDA_ERROR_OUT_OF_MEMORY
    assert "allocpitch rc=2 pitch=0" in lines
    assert lines.count(f"meminfo free={1024 * mib} total={1024 * mib}") == 1
    assert f"alloc {900 * mib} rc=0" in lines
    assert "NVSHARE_MEM_LIMIT" in out.stderr  # the refusal is explained on stderr


def test_small_allocations_up_to_the_gpus_memory_exactly(hook_lib, scheduler_factory, tmp_path):
    """Small allocations are admitted from a budget each answer of the daemon leaves (a sixteenth
    of the headroom): an 8 MiB GPU still lets exactly 32 of 40 256-KiB allocations through,
    freeing some lets as many more through, and refusals are the daemon's."""
    kib = 1 << 10
    scheduler = scheduler_factory(gpus=[{"uuid": GPU0, "memory": "8M"}], memory_reserve_percent=0)
    scheduler.client().register_job(143, uid=os.getuid(), gid=os.getgid(), gpu_index=[0])
    job = Job.__new__(Job)
    job.env = {"NVSHARE_SOCKET": scheduler.socket, "NVSHARE_JOB_ID": "143", "SLURM_STEP_ID": "0",
               "CUDA_VISIBLE_DEVICES": GPU0, "NVSHARE_MANAGED_GPUS": GPU0,
               "FAKE_CUDA_TRACE": str(tmp_path / "trace")}
    steps = ["init", "ctx:0"] + [f"alloc:{256 * kib}"] * 40 + ["free:0", "free:0", "free:0"] \
        + [f"alloc:{256 * kib}"] * 5
    out = run_nvtest(hook_lib, steps, env=job.env)
    assert out.returncode == 0, out.stdout + out.stderr
    rcs = [line.split("rc=")[1] for line in out.stdout.splitlines() if line.startswith("alloc ")]
    assert rcs[:40] == ["0"] * 32 + ["2"] * 8, rcs
    assert rcs[40:] == ["0"] * 3 + ["2"] * 2, rcs
    assert "refused by nvshare-scheduler" in out.stderr


def test_memory_is_reported_to_the_daemon(hook_lib, scheduler, tmp_path, procs):
    job = Job(scheduler, 142, tmp_path / "trace", gpu_index=[1])
    proc = start_nvtest(hook_lib, ["init", "ctx:1", f"alloc:{3 << 20}", "vm:4194304", "launch:1000",
                                   "sync", "sleep:1500"], job.env)
    procs.append(proc)
    deadline = time.monotonic() + 10
    used = None
    # 3 MiB is swappable memory, which takes whole 2 MiB granules on the GPU: 4 MiB is what it holds.
    while time.monotonic() < deadline:
        gpus = {g["uuid"]: g for g in scheduler.client().status()["gpus"]}
        used = gpus[GPU1]["memory_used"]
        if used == 4 << 20:
            break
        time.sleep(0.05)
    assert used == 4 << 20
    finish(proc)


def test_one_process_on_two_gpus_waits_for_the_holder_of_one(hook_lib, concurrent, tmp_path, procs):
    """A job placed on two GPUs takes gang turns (docs/design-scheduler.md): one process using
    both waits for the single-GPU job's work on GPU 1 (its GPU 0 work may start first, when its
    GPU 0 request came first), and completes."""
    trace = tmp_path / "trace"
    other = Job(concurrent, 151, trace, gpu_index=[1])
    both = Job(concurrent, 152, trace, gpu_index=[0, 1])
    procs.append(start_nvtest(hook_lib, ["init", "ctx:1", "launch:700000", "sync"], other.env))
    time.sleep(0.2)
    procs.append(start_nvtest(hook_lib, ["init", "thread:1:100000:1", "thread:0:100000:3", "join"],
                              both.env))
    for p in procs:
        finish(p)
    rows = read_trace(trace)
    holder_end = max(r[3] for r in rows if r[0] == procs[0].pid)
    mine = [r for r in rows if r[0] == procs[1].pid]
    on0 = [r for r in mine if r[1] == GPU0]
    on1 = [r for r in mine if r[1] == GPU1]
    assert len(on0) == 3 and len(on1) == 1
    assert on1[0][2] >= holder_end
    assert overlaps(rows, GPU1) == []



@pytest.mark.parametrize("copy", ["peercopy", "peercopy3d"])
def test_a_peer_copy_waits_for_both_gpus(hook_lib, concurrent, tmp_path, procs, copy):
    """cuMemcpyPeer and cuMemcpy3DPeer read one GPU and write another: they run only while the
    process holds both, never beside another job's kernel on the peer GPU (where its memory may be
    swapped out)."""
    trace = tmp_path / "trace"
    other = Job(concurrent, 161, trace, gpu_index=[1])
    both = Job(concurrent, 162, trace, gpu_index=[0, 1])
    procs.append(start_nvtest(hook_lib, ["init", "ctx:1", "launch:300000", "sync", "launch:300000", "sync"],
                              other.env))
    time.sleep(0.2)
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync", f"{copy}:1:65536:3"],
                              both.env))
    outs = [finish(p) for p in procs]
    assert f"{copy} ok rounds=3" in outs[1], outs[1]
    rows = read_trace(trace)
    copies_on1 = [r for r in rows if r[0] == procs[1].pid and r[1] == GPU1]
    assert len(copies_on1) == 3
    assert overlaps(rows, GPU1) == []

def test_a_3d_peer_copy_ignores_the_context_of_an_array_side(hook_lib, concurrent, tmp_path, procs):
    """The driver ignores srcContext when the source is an array, so a descriptor reused from an
    earlier copy may still name another GPU there: the copy must not ask for that GPU's lock (and
    wait for another job's turn on a GPU it does not touch)."""
    job = Job(concurrent, 171, tmp_path / "trace", gpu_index=[0, 1])
    out = run_nvtest(hook_lib, ["init", "ctx:0", "peercopy3darray:1"],
                     {**job.env, "NVSHARE_LOG_LEVEL": "debug"})
    assert "peercopy3darray rc=0" in out.stdout, out.stdout + out.stderr
    assert f"gpu {GPU0}: lock requested" in out.stderr, out.stderr
    assert f"gpu {GPU1}: lock requested" not in out.stderr, out.stderr


def test_the_program_survives_a_daemon_restart(hook_lib, concurrent, tmp_path, procs):
    trace = tmp_path / "trace"
    job = Job(concurrent, 161, trace, gpu_index=[0])
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "alloc:1048576", "burst:5000:40:20", "meminfo"], job.env)
    procs.append(proc)
    time.sleep(0.4)
    concurrent.stop()
    time.sleep(0.5)
    concurrent.start()
    out = finish(proc)
    assert len(read_trace(trace)) == 40
    # The restarted daemon knows the 1 MiB again (re-sent), and its usable total is the job's view.
    free, total = map(int, re.search(r"meminfo free=(\d+) total=(\d+)", out).groups())
    assert total < 16 << 30 and free == total - (1 << 20)
    assert "lost the connection to nvshare-scheduler" in proc.stderr_text


@pytest.mark.parametrize("policy", ["wait", "run"])
def test_daemon_absent_at_start(hook_lib, scheduler, tmp_path, procs, policy):
    trace = tmp_path / "trace"
    job = Job(scheduler, 171, trace, gpu_index=[0], NVSHARE_ON_DAEMON_LOSS=policy)
    scheduler.stop()
    began = time.monotonic_ns()
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync"], job.env)
    procs.append(proc)
    if policy == "run":
        finish(proc, timeout=5)
        assert read_trace(trace)[0][2] - began < 2e9
        return
    time.sleep(1.0)
    assert proc.poll() is None, "GPU work ran while the daemon was away under policy 'wait'"
    assert not trace.exists() or trace.read_text() == ""
    restarted = time.monotonic_ns()
    scheduler.start()
    finish(proc, timeout=15)
    assert read_trace(trace)[0][2] >= restarted


def test_fork_child_gets_its_own_connection(hook_lib, scheduler, tmp_path):
    job = Job(scheduler, 181, tmp_path / "trace", gpu_index=[0])
    out = run_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync", "fork", "launch:1000", "sync"],
                     env=job.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fork child exit=0" in out.stdout
    child = int(re.search(r"child (\d+) ok", out.stdout).group(1))
    pids = {r[0] for r in read_trace(tmp_path / "trace")}
    assert child in pids and len(pids) == 2
    log = scheduler.log()
    assert f"pid {child}" in log and "client registered" in log


def test_a_process_that_never_uses_cuda_never_connects(hook_lib, scheduler, tmp_path):
    job = Job(scheduler, 191, tmp_path / "trace", gpu_index=[0])
    out = run_nvtest(hook_lib, ["sleep:50"], env=job.env)
    assert out.returncode == 0
    time.sleep(0.2)
    assert "client registered" not in scheduler.log()
    out = run_nvtest(hook_lib, ["init", "ctx:0", "launch:100", "sync"], env=job.env)
    assert out.returncode == 0
    deadline = time.monotonic() + 5
    while "client registered" not in scheduler.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "client registered" in scheduler.log()


def test_many_threads_making_their_first_cuda_call_at_once(hook_lib, scheduler, tmp_path):
    """The driver is loaded and the daemon reached once, however many threads start at once; every
    thread's calls work (the real-function table is never read half filled)."""
    job = Job(scheduler, 191, tmp_path / "trace", gpu_index=[0], NVSHARE_LOG_LEVEL="debug")
    for _ in range(5):
        out = run_nvtest(hook_lib, ["initrace:32"], env=job.env, via="link")
        assert "initrace threads=32 failed=0" in out.stdout, out.stdout + out.stderr
        assert out.stderr.count("connected to nvshare-scheduler") == 1, out.stderr


def test_fork_while_the_allocation_table_grows(hook_lib, scheduler, tmp_path):
    """Children forked while another thread's allocations grow the hook's table exit cleanly (no
    double free of a table half moved), and the parent's books stay right: after its 6000 small
    allocations are freed, an allocation of its whole NVSHARE_MEM_LIMIT still fits."""
    job = Job(scheduler, 192, tmp_path / "trace", gpu_index=[0], NVSHARE_MEM_LIMIT="16M")
    out = run_nvtest(hook_lib, ["init", "ctx:0", "forkgrow:6000:400", f"alloc:{16 << 20}", "freeall"],
                     env=job.env)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"forkgrow allocs=6000 forks=(\d+) children_failed=0 alloc_failed=0 free_failed=0",
                      out.stdout)
    assert found and int(found.group(1)) > 1, out.stdout + out.stderr
    assert f"alloc {16 << 20} rc=0" in out.stdout, out.stdout + out.stderr
