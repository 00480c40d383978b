"""A job's own memory, a co-tenant process, a shared budget, and the scenario that uses them."""

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from _helpers import cpu_trainer

from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedBudget
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.jobs.multitenant import JobResult, JobSpec, budget_for, over_budget
from lightning_bandlimit.memory import CoTenant, ProbeUnavailable, RampTrace, SharedBudgetProbe
from lightning_bandlimit.memory.process import (
    peak_resident_bytes,
    release_cached_memory,
    reset_peak_resident,
    resident_bytes,
)
from lightning_bandlimit.models import ImageClassifier

MIB = 2**20


def test_resident_and_peak_follow_a_touched_allocation() -> None:
    # Free heap memory left resident by earlier tests would serve the allocation below unseen.
    release_cached_memory(torch.device("cpu"))
    assert reset_peak_resident()
    before = resident_bytes()
    block = np.ones(64 * MIB // 8)  # touched: resident
    assert resident_bytes() - before > 48 * MIB
    del block
    release_cached_memory(torch.device("cpu"))
    assert peak_resident_bytes() - before > 48 * MIB  # the high-water mark remembers it
    assert reset_peak_resident() and peak_resident_bytes() < before + 48 * MIB  # until reset


def test_process_memory_of_a_missing_process_is_an_error_that_names_the_file() -> None:
    with pytest.raises(OSError, match="/proc/999999999/status"):
        resident_bytes(999999999)


@pytest.mark.slow
def test_cotenant_grows_shrinks_and_reports_its_own_resident_set() -> None:
    with CoTenant() as other:
        idle = other.resident
        assert 0 < idle < 64 * MIB and resident_bytes(other.pid) == pytest.approx(idle, abs=2 * MIB)
        grown = other.hold(96 * MIB)
        assert grown - idle == pytest.approx(96 * MIB, abs=8 * MIB)
        assert resident_bytes(other.pid) == pytest.approx(grown, abs=2 * MIB)  # measured, not claimed
        assert other.hold(16 * MIB) < grown - 64 * MIB  # shrinking gives memory back
        pid = other.pid
    with pytest.raises(OSError):
        resident_bytes(pid)  # the process is gone
    with pytest.raises(ValueError, match="target must be >= 0, got -1"):
        CoTenant().hold(-1)
    with pytest.raises(ValueError, match="chunk_bytes must be >= 4096, got 100"):
        CoTenant(chunk_bytes=100)


def test_ramp_trace_shape_and_checks() -> None:
    trace = RampTrace(low=10, high=110, start=0.2, ramp=0.4, leave=0.8)
    values = [trace(f / 10) for f in range(11)]
    assert values == [10, 10, 10, 35, 60, 85, 110, 110, 10, 10, 10]
    with pytest.raises(ValueError, match="low <= high"):
        RampTrace(low=5, high=1)
    with pytest.raises(ValueError, match="start \\+ ramp <= leave"):
        RampTrace(low=0, high=1, start=0.6, ramp=0.3, leave=0.7)


def test_shared_budget_probe_subtracts_both_and_clips_and_fails_as_unavailable() -> None:
    own, others = [100], [300]
    probe = SharedBudgetProbe(1000, own=lambda: own[0], others=lambda: others[0])
    assert probe.read().free == 600 and probe.read().own == 100  # the job's own share, for the memory model
    others[0] = 950
    assert probe.read().free == 0  # overdrawn: clipped, never negative

    def gone() -> int:
        raise OSError("no such process")

    with pytest.raises(ProbeUnavailable, match="no such process"):
        SharedBudgetProbe(1000, own=gone, others=gone).read()
    with pytest.raises(ValueError, match="budget must be >= 1, got 0"):
        SharedBudgetProbe(0, own=gone, others=gone)
    with pytest.raises(TypeError, match="budget must be an int >= 1, got 1.5"):
        SharedBudgetProbe(1.5, own=gone, others=gone)  # type: ignore[arg-type]


def _trainer(tmp_path: Path, callbacks: list[pl.Callback], steps: int) -> pl.Trainer:
    return cpu_trainer(default_root_dir=tmp_path, max_steps=steps, limit_val_batches=0, callbacks=callbacks)


@pytest.mark.slow
def test_shared_budget_moves_the_cotenant_measures_each_step_and_counts_overdrafts(tmp_path: Path) -> None:
    release_cached_memory(torch.device("cpu"))  # as above: the job's steps allocate anew
    trace = RampTrace(low=0, high=64 * MIB, start=0.25, ramp=0.25, leave=0.75)
    shared = SharedBudget(budget=None, trace=trace)
    _trainer(tmp_path, [shared], steps=8).fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=64, val_size=8, batch_size=8),
    )
    timeline = shared.timeline
    assert [r["step"] for r in timeline] == list(range(1, 9))
    cotenant = [r["cotenant_bytes"] for r in timeline]
    assert max(cotenant) - min(cotenant) == pytest.approx(64 * MIB, abs=8 * MIB)  # its real resident set
    assert (
        cotenant.index(max(cotenant)) in (4, 5) and cotenant[-1] < max(cotenant) - 48 * MIB
    )  # grew, then left
    assert all(r["job_bytes"] >= r["start_bytes"] > 0 for r in timeline)
    assert shared.cotenant is None  # the process ended with the fit
    totals = sorted(r["job_bytes"] + r["cotenant_bytes"] for r in timeline)
    assert shared.over_budget_steps(totals[5]) == 2 and shared.over_budget_steps(totals[-1]) == 0
    with pytest.raises(ValueError, match="no budget"):
        shared.over_budget_steps()


def test_shared_budget_probe_reads_the_steps_start_first_and_within_its_peak() -> None:
    calls: list[str] = []

    def own() -> int:
        calls.append("own")
        return 500

    def base() -> int:
        calls.append("base")
        return 700  # read before a peak that lags it (no high-water mark): taken as the peak

    probe = SharedBudgetProbe(1000, own=own, others=lambda: 100, own_base=base)
    reading = probe.read()
    assert calls == ["base", "own"] and (reading.own, reading.own_base) == (500, 500)
    assert SharedBudgetProbe(1000, own=lambda: 500, others=lambda: 0).read().own_base is None


def test_shared_budget_reads_the_start_of_the_step_whose_peak_it_reads(tmp_path: Path) -> None:
    release_cached_memory(torch.device("cpu"))
    trace = RampTrace(low=0, high=8 * MIB)
    shared = SharedBudget(budget=4 * 2**30, trace=trace)
    _trainer(tmp_path, [shared], steps=6).fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=64, val_size=8, batch_size=8),
    )
    assert shared.probe is not None
    reading = shared.probe.read()  # nothing read it during the fit: the largest step peak of all
    largest = max(shared.timeline, key=lambda r: (r["job_bytes"], r["step"]))
    assert (reading.own, reading.own_base) == (largest["job_bytes"], largest["start_bytes"])
    # not ``<``: without MALLOC_MMAP_THRESHOLD_ glibc may serve a small step from pages already
    # resident, so its peak need not rise above its start (seen when this test runs late in a suite)
    assert reading.own_base <= reading.own


def test_shared_budget_must_come_before_the_adaptive_callback(tmp_path: Path) -> None:
    shared = SharedBudget(budget=4 * 2**30, trace=RampTrace(low=0, high=MIB))
    adaptive = AdaptiveBandLimit(probe=shared.probe, check_every_n_steps=1)
    with pytest.raises(ValueError, match="before AdaptiveBandLimit"):
        _trainer(tmp_path, [adaptive, shared], steps=1).fit(
            ImageClassifier("small_cnn", width=4),
            SyntheticImageDataModule(train_size=8, val_size=8, batch_size=8),
        )


@pytest.mark.slow
def test_adaptive_callback_raises_compression_when_the_cotenant_eats_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_meter(*args: object, **kwargs: object) -> None:
        raise AssertionError("the budget probe measures the job: no saved-tensor meter on the step")

    monkeypatch.setattr("lightning_bandlimit.callbacks.ladder_step_peak.SavedTensorMeter", no_meter)
    # A budget the job fits with 256 MiB to spare, and a co-tenant that takes all of it.
    trace = RampTrace(low=0, high=320 * MIB, start=0.3, ramp=0.1, leave=0.7)
    budget = resident_bytes() + 256 * MIB
    shared = SharedBudget(budget=budget, trace=trace)
    adaptive = AdaptiveBandLimit(
        probe=shared.probe,
        min_free=64 * MIB,
        release_free=128 * MIB,
        check_every_n_steps=1,
        release_checks=1,
        cooldown_checks=0,
        lower_step=0.2,
        recalibrate_bn=0,
    )
    _trainer(tmp_path, [shared, adaptive], steps=10).fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=80, val_size=8, batch_size=8),
    )
    compression = [r["compression"] for r in shared.timeline]
    assert compression[0] == 0.0 and max(compression) > 0.0  # raised while the co-tenant held the budget
    assert compression[-1] < max(compression)  # and given back after it left
    assert any(d["reason"] == "raise" for d in adaptive.decisions)
    # the memory model learns the job's measured resident peak, the quantity the budget counts
    by_step = {r["step"]: r["job_bytes"] for r in shared.timeline}
    assert [d["job_peak_bytes"] for d in adaptive.decisions] == [
        by_step[d["step"]] for d in adaptive.decisions
    ]


def _result(timeline: list[dict]) -> JobResult:
    return JobResult(
        name="plain",
        mode="plain",
        val_accuracy=0.9,
        final_compression=0.0,
        achieved_compression=0.0,
        compression_changes=0,
        step_ms=1.0,
        wall_s=1.0,
        peak_job_bytes=max(r["job_bytes"] for r in timeline),
        step_increment_bytes=100,
        bn_recalibrations=0,
        bn_recalibration_seconds=0.0,
        checkpoint="",
        log_dir="",
        timeline=timeline,
    )


def test_budget_is_below_what_the_plain_job_needs_beside_the_cotenants_peak() -> None:
    trace = RampTrace(low=0, high=1000, start=0.2, ramp=0.2, leave=0.8)
    cotenant = [trace(i / 10) for i in range(10)]
    plain = _result(
        [
            {"step": i + 1, "job_bytes": 500, "start_bytes": 400, "cotenant_bytes": c}
            for i, c in enumerate(cotenant)
        ]
    )
    budget = budget_for(plain, trace, below=0.2)
    assert budget == 1500 - 20  # held: 500 + 1000, less 0.2 x the 100-byte step increment
    assert over_budget(plain, budget) == 4  # the four steps at the co-tenant's peak
    with pytest.raises(ValueError, match="below"):
        budget_for(plain, trace, below=1.0)


def test_job_spec_checks_its_mode_and_an_adaptive_job_needs_a_budget() -> None:
    trace = {"low": 0, "high": 1}
    with pytest.raises(ValueError, match="mode must be one of"):
        JobSpec("x", "elastic", "out", trace)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs budget"):
        JobSpec("x", "adaptive", "out", trace)
    with pytest.raises(ValueError, match="low <= high"):
        JobSpec("x", "plain", "out", {"low": 2, "high": 1})
    with pytest.raises(ValueError, match="threads"):
        JobSpec("x", "plain", "out", trace, threads=0)
    assert JobSpec("x", "plain", "out", trace, threads=1).threads == 1
