"""Prometheus metrics and per-job GPU accounting of the real nvshare-scheduler, scraped over HTTP
after a known scenario driven by real client processes (tests/lockclient.py)."""
from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import FAKE_GPUS
from helpers_daemon import G, register, wait_for_log, wait_for_waiters

GPU0 = FAKE_GPUS[0]["uuid"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample as {(name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples, name, **labels):
    found = [v for (n, lab), v in samples.items()
             if n == name and all((k, str(x)) in lab for k, x in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def test_metrics_after_a_hand_over(scheduler_factory, clients):
    port = free_port()
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30, metrics_port=port, metrics_user_labels=True)
    register(sched, 1, user="alice")
    register(sched, 2, user="bob", share_class="low", class_reason="partition scavenge")
    a, b = clients(sched, 1), clients(sched, 2)
    a.send(f"request {GPU0}")
    a.expect("grant", gpu=GPU0)
    a.send(f"mem {GPU0} {2 * G} {G} 0 0")
    b.send(f"request {GPU0}")
    assert wait_for_waiters(sched, 1) == [2]
    time.sleep(0.3)                            # bob waits, alice holds, for a measurable while
    a.send(f"release {GPU0}")
    b.expect("grant", gpu=GPU0)
    samples = scrape(port)

    gpu = dict(gpu=GPU0, index=0)
    assert sample(samples, "nvshare_gpu_handovers_total", **gpu) == 2
    assert sample(samples, "nvshare_gpu_holders", **gpu) == 1
    assert sample(samples, "nvshare_gpu_waiters", **gpu) == 0
    assert sample(samples, "nvshare_gpu_memory_bytes", kind="used", **gpu) == 2 * G
    assert sample(samples, "nvshare_gpu_memory_bytes", kind="fixed", **gpu) == G
    assert sample(samples, "nvshare_gpu_memory_bytes", kind="total", **gpu) == 16 * G
    assert sample(samples, "nvshare_gpu_info", mode="concurrent", sharing="turns", **gpu) == 1
    assert sample(samples, "nvshare_jobs_registered") == 2
    held_a = sample(samples, "nvshare_job_gpu_held_seconds_total", job=1, user="alice",
                    **{"class": "normal"}, **gpu)
    wait_b = sample(samples, "nvshare_job_gpu_wait_seconds_total", job=2, user="bob",
                    **{"class": "low"}, **gpu)
    assert held_a >= 0.3 and wait_b >= 0.3
    assert held_a >= wait_b                    # alice held the GPU all the time bob waited
    assert sample(samples, "nvshare_job_gpu_wait_seconds_total", job=1, **gpu) == 0
    assert sample(samples, "nvshare_job_gpu_memory_peak_bytes", job=1, **gpu) == 2 * G
    # Counters only grow: bob still holds, so his held time goes on.
    time.sleep(0.1)
    later = scrape(port)
    assert sample(later, "nvshare_job_gpu_held_seconds_total", job=2, **gpu) > \
        sample(samples, "nvshare_job_gpu_held_seconds_total", job=2, **gpu)


def test_status_and_unregister_report_a_jobs_usage(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    register(sched, 7, user="carol")
    a = clients(sched, 7)
    a.send(f"request {GPU0}")
    a.expect("grant", gpu=GPU0)
    a.send(f"mem {GPU0} {3 * G} 0 0 0")
    time.sleep(0.2)
    from nvshare_slurm.wire.proto import C
    deadline = time.monotonic() + 5
    while True:
        usage = sched.client().status(C.NVSHARE_STATUS_JOB, 7)["jobs"][0]["usage"][GPU0]
        if usage["peak_memory"] == 3 * G or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert usage["peak_memory"] == 3 * G and usage["turns"] == 1 and usage["held_sec"] >= 0.2
    sched.client().unregister_job(7)
    wait_for_log(sched, "job 7: unregistered (1 clients disconnected); GPU usage: gpu0 held=")
    assert "peak=3.0G swapped=0B turns=1" in sched.log()


def test_metrics_endpoint_refuses_other_paths_and_outlives_a_stalled_peer(scheduler_factory):
    port = free_port()
    scheduler_factory(metrics_port=port)
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET /metr")              # never finishes its request
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
    assert info.value.code == 404
    assert sample(scrape(port), "nvshare_jobs_registered") == 0
    stalled.close()


def test_metrics_port_in_use_stops_the_daemon_at_start(scheduler_factory):
    """A site that asked for metrics must not get a scheduler that silently serves none."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        sched = scheduler_factory(start=False, metrics_port=port)
        with pytest.raises(RuntimeError, match="exited 1"):
            sched.start()
    assert f"metrics: cannot listen on 127.0.0.1 port {port}: Address already in use; " \
           "not starting" in sched.log()
    assert not __import__("os").path.exists(sched.socket)


def test_metrics_listen_on_loopback_by_default(scheduler_factory):
    port = free_port()
    sched = scheduler_factory(metrics_port=port)
    wait_for_log(sched, f"metrics: serving http://127.0.0.1:{port}/metrics")
    # Every other address of this machine is refused: only 127.0.0.1 listens.
    other = [a for a in {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                                    socket.AF_INET)}
             if not a.startswith("127.")]
    for address in other:
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()
    assert sample(scrape(port), "nvshare_jobs_registered") == 0


@pytest.mark.parametrize("settings,expected", [
    ({}, "corun"), ({"auto_share": "turns"}, "turns"), ({"scheduling_mode": "concurrent"}, "turns"),
    ({"scheduling_mode": "serial"}, "serial")])
def test_sharing_of_an_idle_gpu_is_a_value_the_guide_lists(scheduler_factory, settings, expected):
    """Before any client came, `sharing` says what the policy would do, never the mode's name."""
    port = free_port()
    scheduler_factory(metrics_port=port, **settings)
    samples = scrape(port)
    assert sample(samples, "nvshare_gpu_info", gpu=GPU0, sharing=expected) == 1


def test_metrics_bind_all_interfaces_when_asked(scheduler_factory):
    port = free_port()
    sched = scheduler_factory(metrics_port=port, metrics_bind="0.0.0.0")
    wait_for_log(sched, f"metrics: serving http://0.0.0.0:{port}/metrics")
    assert sample(scrape(port), "nvshare_jobs_registered") == 0


def test_user_names_stay_out_of_labels_unless_turned_on(scheduler_factory, clients):
    for on in (False, True):
        port = free_port()
        sched = scheduler_factory(metrics_port=port, metrics_user_labels=on)
        register(sched, 1, user="alice")
        a = clients(sched, 1)
        a.send(f"request {GPU0}")
        a.expect("grant", gpu=GPU0)
        samples = scrape(port)
        held = [lab for (name, lab) in samples if name == "nvshare_job_gpu_held_seconds_total"]
        assert len(held) == 1
        assert (("user", "alice") in held[0]) is on
        assert any(("job", "1") in lab for lab in held)


def test_the_shipped_dashboard_asks_only_for_metrics_the_daemon_serves(scheduler_factory, clients):
    import json
    import re
    from conftest import REPO
    port = free_port()
    sched = scheduler_factory(metrics_port=port)
    register(sched, 1, user="alice")
    a = clients(sched, 1)
    a.send(f"request {GPU0}")
    a.expect("grant", gpu=GPU0)
    served = {name for name, _ in scrape(port)}
    dashboard = json.loads((REPO / "slurm" / "grafana-dashboard.json").read_text())
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"\bnvshare_[a-z_]+", target["expr"])}
    assert asked and asked <= served, asked - served
