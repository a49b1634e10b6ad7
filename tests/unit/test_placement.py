"""place_job: least loaded first, min(slots, GPUs) distinct GPUs, Slurm's choice followed."""
from __future__ import annotations

import pytest

from nvshare_slurm.policy.placement import GpuLoad, PlacementError, place_job

NOGPU, INVAL = 4, 3


def loads(*spec):
    return [GpuLoad(f"GPU-{i}", i, mem, jobs) for i, (mem, jobs) in enumerate(spec)]


def uuids(placed):
    return [g.uuid for g in placed]


def test_least_memory_then_fewest_jobs_then_index():
    gpus = loads((5, 0), (1, 3), (1, 2), (1, 2))
    assert uuids(place_job(gpus, 1, None, NOGPU, INVAL)) == ["GPU-2"]
    assert uuids(place_job(gpus, 3, None, NOGPU, INVAL)) == ["GPU-2", "GPU-3", "GPU-1"]


def test_more_slots_than_gpus_uses_each_gpu_once():
    assert uuids(place_job(loads((0, 0), (0, 0)), 5, None, NOGPU, INVAL)) == ["GPU-0", "GPU-1"]


def test_slurm_choice_is_followed_in_its_order():
    gpus = loads((0, 0), (0, 0), (9, 9))
    assert uuids(place_job(gpus, 0, [2, 0, 2], NOGPU, INVAL)) == ["GPU-2", "GPU-0"]
    with pytest.raises(PlacementError) as err:
        place_job(gpus, 0, [7], NOGPU, INVAL)
    assert err.value.status == NOGPU and "7" in str(err.value)


def test_no_gpus_and_no_slots_are_clear_errors():
    with pytest.raises(PlacementError) as err:
        place_job([], 1, None, NOGPU, INVAL)
    assert err.value.status == NOGPU and "no GPU" in str(err.value)
    with pytest.raises(PlacementError) as err:
        place_job(loads((0, 0)), 0, None, NOGPU, INVAL)
    assert err.value.status == INVAL
