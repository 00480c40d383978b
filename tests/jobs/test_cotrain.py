"""Two real training jobs on one budget, each in its own process (the several-jobs scenario's
path: ``launch_set``, ``SharedBudget`` with peers, ``SharedDevice``)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from lightning_bandlimit.jobs.multitenant import JobSpec, launch_set, over_budget
from lightning_bandlimit.memory import RampTrace

MIB = 2**20
TINY = [
    *("--trainer.max_epochs", "1"),
    *("--data.train_size", "256"),
    *("--data.batch_size", "32"),
    *("--trainer.limit_val_batches", "1"),
    *("--model.width", "4"),
]
STEPS = 256 // 32


@pytest.mark.slow
# Several training processes measuring each other's memory in /proc: one such test at a time
# (the main job's and the co-tenant jobs' tests, side by side under four busy workers, ran past 300 s).
@pytest.mark.xdist_group("multitenant-jobs")
@pytest.mark.timeout(600)
def test_two_coordinated_jobs_measure_each_other_and_leave_the_ledger(tmp_path: Path) -> None:
    device = tmp_path / "device"
    specs = [
        JobSpec(
            f"job{k}",
            "adaptive",
            str(tmp_path / f"job{k}"),
            asdict(RampTrace(low=0, high=0)),
            overrides=TINY,
            budget=4096 * MIB,  # roomy: the path, not the pressure, is under test here
            min_free=64 * MIB,
            release_free=128 * MIB,
            device=str(device),
            coordinate=True,
            seed=k,
            warm_data=True,
            threads=1,  # each job its share of the 2 cores: tiny convolutions on 2 threads each thrash
        )
        for k in range(2)
    ]
    results = launch_set(specs, stagger_s=0.0, timeout=420)  # about 40 s alone; room for a loaded machine
    assert [r.name for r in results] == ["job0", "job1"]
    for result in results:
        assert len(result.timeline) == STEPS
        seen = [r["peer_bytes"] for r in result.timeline]
        assert max(seen) > 100 * MIB  # the other job's resident set (a torch process), measured
        assert over_budget(result, 4096 * MIB) == 0
    assert not list((device / "ledger").glob("*/*.json"))  # both left
    assert not list((device / "processes").glob("*.json"))


def test_a_peer_counts_at_the_larger_of_its_resident_set_and_its_last_step_peak(tmp_path: Path) -> None:
    """What a GPU's caching allocator holds between steps, so a peer's phase is not growth."""
    from lightning_bandlimit.jobs.multitenant.run import _register
    from lightning_bandlimit.memory.process import resident_bytes

    def spec(name: str) -> JobSpec:
        trace = asdict(RampTrace(low=0, high=0))
        return JobSpec(name, "plain", str(tmp_path / name), trace, device=str(tmp_path))

    _, publish_a = _register(spec("a"))
    others_b, publish_b = _register(spec("b"))
    own = resident_bytes()  # both entries name this process: a's reading is this resident set
    assert others_b() >= own - 64 * MIB
    publish_a(own + 512 * MIB)  # a's last step peaked above its resident set now
    assert others_b() == own + 512 * MIB
    publish_b(10 * own)  # b's own entry is not its peer
    assert others_b() == own + 512 * MIB
    (tmp_path / "processes" / "c.json").write_text('{"pid": 999999999, "step_peak": 0}')  # gone
    (tmp_path / "processes" / "d.json").write_text("{")  # being written
    assert others_b() == own + 512 * MIB


def test_warm_data_loads_every_training_and_validation_example_before_the_first_step() -> None:
    """So a caching dataset's memory is there from the start, not filling through epoch 0."""
    from types import SimpleNamespace

    from lightning_bandlimit.data import SyntheticImageDataModule
    from lightning_bandlimit.jobs.multitenant.run import _WarmData

    data = SyntheticImageDataModule(train_size=12, val_size=5, test_size=3, batch_size=4)
    data.setup("fit")
    assert data.train_set._rendered is None  # nothing loaded yet
    _WarmData().setup(SimpleNamespace(datamodule=data), None, "validate")  # type: ignore[arg-type]
    assert data.train_set._rendered is None  # fit only
    _WarmData().setup(SimpleNamespace(datamodule=data), None, "fit")  # type: ignore[arg-type]
    assert bool(data.train_set._rendered.all()) and bool(data.val_set._rendered.all())
    assert data.test_set._rendered is None
