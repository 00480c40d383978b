"""A probe that fails in any way (an error of any type, a reading that cannot be right) never ends a
fit: ``AdaptiveBandLimit`` skips that check with its levers where they are, says so once per
cause, and reads the probe no more after ``PROBE_FAILURES_TO_STOP`` failed checks in a row;
``SharedDevice`` counts peers at what they published when the probe cannot list the device's
processes."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer, run_ddp_script

from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
from lightning_bandlimit.callbacks.ladder_reading import PROBE_FAILURES_TO_STOP, held_bytes
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.ladder import Setting
from lightning_bandlimit.memory import MemoryReading, ProbeUnavailable, ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.tenants import Ledger
from lightning_bandlimit.tenants.ledger import host_device

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.xdist_group("probe_faults"),  # the clean fit is made once, on one worker
]

M = 1_000_000
TOTAL = 100 * M  # min_free 20 MB (SCRIPTED_ADAPTIVE)
FIRST_SHORT = 3  # the read whose 10 MB free makes the job raise
TRACE = [80 * M] * FIRST_SHORT + [10 * M] * 9
STEPS = len(TRACE)
ALWAYS = range(FIRST_SHORT, 10**6)  # every read from the first short one on


def _forged(total: Any, free: Any, own: Any = None, own_base: Any = None) -> MemoryReading:
    """A reading built past ``MemoryReading``'s own checks (as a careless custom probe may)."""
    reading = object.__new__(MemoryReading)
    fields = (("total", total), ("free", free), ("source", "faulty"), ("own", own), ("own_base", own_base))
    for name, value in fields:
        object.__setattr__(reading, name, value)
    return reading


def _raise(error: Exception) -> Callable[[], MemoryReading]:
    def fault() -> MemoryReading:
        raise error

    return fault


# (fault, what the warning names as its cause)
FAULTS = {
    "OSError": (_raise(OSError("sensor gone")), "OSError: sensor gone"),
    "RuntimeError": (_raise(RuntimeError("driver hiccup")), "RuntimeError: driver hiccup"),
    "ProbeUnavailable": (_raise(ProbeUnavailable("NVML busy")), "ProbeUnavailable: NVML busy"),
    "nan-free-refused": (
        lambda: MemoryReading(total=TOTAL, free=math.nan, source="faulty"),  # raises TypeError
        "TypeError: MemoryReading.free",
    ),
    "nan-free": (lambda: _forged(TOTAL, math.nan), "free is not finite"),
    "inf-total": (lambda: _forged(math.inf, 10 * M), "total is not finite"),
    "float-free": (lambda: _forged(TOTAL, 10.5 * M), "free is not an integer"),
    "free-over-total": (lambda: _forged(TOTAL, TOTAL + 1), "free is more than total"),
    "negative-free": (lambda: _forged(TOTAL, -1), "free is negative"),
    "total-zero": (lambda: MemoryReading(total=0, free=0, source="faulty"), "total is not > 0"),
    "negative-own": (lambda: _forged(TOTAL, 10 * M, own=-5), "own is negative"),
    "base-over-own": (lambda: _forged(TOTAL, 10 * M, own=M, own_base=2 * M), "own_base is more than own"),
    "base-without-own": (lambda: _forged(TOTAL, 10 * M, own_base=M), "own_base is more than own"),
    "nan-base": (lambda: _forged(TOTAL, 10 * M, own=M, own_base=math.nan), "own_base is not finite"),
    "not-a-reading": (lambda: None, "not a MemoryReading"),
}


class _Faulty(ScriptedProbe):
    """A scripted device whose reads numbered in ``bad`` (from 0) give ``fault`` instead: a
    good read gets the trace's value at its own number, as if the bad one had been read."""

    def __init__(
        self, fault: Callable[[], Any], bad: Container[int], frees: list[int] = TRACE, own: bool = False
    ) -> None:
        super().__init__(free=frees, total=TOTAL)
        self.fault, self.bad, self.calls, self.measures_own = fault, bad, 0, own

    def read(self) -> MemoryReading:
        call, self.calls = self.calls, self.calls + 1
        if call in self.bad:
            return self.fault()
        self.reads = call
        reading = super().read()
        return (
            MemoryReading(reading.total, reading.free, reading.source, own=1 * M)
            if self.measures_own
            else reading
        )


def _fit(probe: ScriptedProbe, *callbacks: Any, root: Path) -> tuple[AdaptiveBandLimit, list[str]]:
    """Fit to the end (it must not fail) beside ``probe``; the callback and its probe warnings."""
    adaptive = AdaptiveBandLimit(probe=probe, **SCRIPTED_ADAPTIVE)
    trainer = cpu_trainer([adaptive, *callbacks], default_root_dir=root, max_steps=STEPS, limit_val_batches=0)
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    assert trainer.global_step == STEPS  # the fit finished
    return adaptive, [str(w.message) for w in said if "memory probe" in str(w.message)]


def _first_raise(adaptive: AdaptiveBandLimit) -> int:
    return next(d["step"] for d in adaptive.decisions if d["reason"] == "raise")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> AdaptiveBandLimit:
    adaptive, said = _fit(ScriptedProbe(free=TRACE, total=TOTAL), root=tmp_path_factory.mktemp("clean"))
    assert said == [] and len(adaptive.decisions) == STEPS
    assert adaptive.decisions[FIRST_SHORT]["reason"] == "raise"  # at once, on the first short read
    return adaptive


@pytest.mark.parametrize("fault", FAULTS)
def test_one_bad_reading_skips_only_its_check_with_the_levers_where_they_are(
    tmp_path: Path, clean: AdaptiveBandLimit, fault: str
) -> None:
    error, cause = FAULTS[fault]
    probe = _Faulty(error, bad={FIRST_SHORT})
    adaptive, said = _fit(probe, root=tmp_path)
    assert len(said) == 1 and "_Faulty failed" in said[0] and cause in said[0], said
    assert "check is skipped" in said[0] and "levers stay" in said[0]
    skipped = clean.decisions[FIRST_SHORT]["step"]
    assert [d["step"] for d in adaptive.decisions] == [
        d["step"] for d in clean.decisions if d["step"] != skipped
    ]
    before = adaptive.decisions[FIRST_SHORT - 1]
    assert (before["rung"], before["compression"]) == (0, 0.0)  # nothing moved on the failed check ...
    assert _first_raise(adaptive) == skipped + 1  # ... the next one raised, as the clean run did on it
    assert adaptive.probe is probe and probe.calls == STEPS  # read on at every check


@pytest.mark.parametrize("fault", ["OSError", "free-over-total", "ProbeUnavailable"])
def test_failures_in_a_row_stop_the_readings_said_once(tmp_path: Path, fault: str) -> None:
    error, cause = FAULTS[fault]
    probe = _Faulty(error, bad=ALWAYS)
    adaptive, said = _fit(probe, root=tmp_path)
    assert len(said) == 2 and cause in said[0] and "check is skipped" in said[0], said
    assert f"_Faulty stopped working: {PROBE_FAILURES_TO_STOP} checks in a row failed" in said[1]
    assert cause in said[1] and "read no more" in said[1]
    assert probe.calls == FIRST_SHORT + PROBE_FAILURES_TO_STOP and adaptive.probe is None
    assert len(adaptive.decisions) == FIRST_SHORT and adaptive.setting == Setting(0, 0.0)  # levers stay


def test_failures_not_in_a_row_never_stop_the_readings(tmp_path: Path) -> None:
    # one good reading between runs of K - 1 failures: every bad check skipped, said once
    run = PROBE_FAILURES_TO_STOP - 1
    bad = {FIRST_SHORT + i for i in range(run)} | {FIRST_SHORT + run + 1 + i for i in range(run)}
    probe = _Faulty(FAULTS["OSError"][0], bad=bad)
    adaptive, said = _fit(probe, root=tmp_path)
    assert len(said) == 1 and "OSError: sensor gone" in said[0], said
    assert adaptive.probe is probe and probe.calls == STEPS
    assert len(adaptive.decisions) == STEPS - len(bad)
    assert _first_raise(adaptive) == adaptive.decisions[FIRST_SHORT]["step"]  # the first good short read


def test_each_cause_is_said_once(tmp_path: Path) -> None:
    causes = ["OSError", "nan-free", "OSError", "free-over-total", "nan-free"]
    bad = {FIRST_SHORT + 2 * i: FAULTS[cause][0] for i, cause in enumerate(causes)}  # a good read between

    def fault() -> MemoryReading:
        return bad[probe.calls - 1]()

    probe = _Faulty(fault, bad=bad)
    adaptive, said = _fit(probe, root=tmp_path)
    assert len(said) == 3 and adaptive.probe is probe, said
    for text, cause in zip(said, ["OSError: sensor gone", "free is not finite", "free is more than total"]):
        assert cause in text


def test_what_a_failing_probe_says_the_job_holds_is_nothing_and_its_fit_goes_on(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    for fault in ("OSError", "nan-free", "negative-own", "not-a-reading", "total-zero"):
        assert held_bytes(_Faulty(FAULTS[fault][0], bad={0}, own=True), cpu) == 0
    assert held_bytes(_Faulty(FAULTS["OSError"][0], bad=(), own=True), cpu) == 1 * M
    # SharedDevice announces the job at on_train_start by the probe's measure of it: the probe
    # fails there (the job announced holding nothing), then at every check, which stop
    probe = _Faulty(FAULTS["OSError"][0], bad=range(10**6), own=True)
    shared = SharedDevice(tmp_path / "ledger", job="b-job")
    adaptive, said = _fit(probe, shared, root=tmp_path)
    assert len(said) == 2 and "OSError: sensor gone" in said[0] and "stopped working" in said[1], said
    assert probe.calls == 1 + PROBE_FAILURES_TO_STOP and adaptive.decisions == []


class _Lister(ScriptedProbe):
    """A scripted device whose listing of its processes' memory is ``listing``."""

    def __init__(self, listing: Callable[[], Any]) -> None:
        super().__init__(free=[80 * M], total=TOTAL)
        self.listing, self.listed = listing, 0

    def process_memory(self) -> Any:
        self.listed += 1
        return self.listing()


PEER_PID = 4_000_000  # no process of this host has it


@pytest.mark.parametrize(
    "listing, cause",
    [
        (_raise(OSError("no such device")), "OSError: no such device"),
        (lambda: [(os.getpid(), 1 * M)], "process memory is not a dict"),
        (lambda: {os.getpid(): 1 * M, PEER_PID: -1}, "memory is negative"),
        (lambda: {os.getpid(): 1 * M, PEER_PID: math.nan}, "memory is not finite"),
        (lambda: {str(PEER_PID): 1 * M}, "process id is not an integer"),
    ],
    ids=["OSError", "not-a-dict", "negative", "nan", "str-pid"],
)
def test_a_failing_process_listing_counts_peers_at_what_they_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listing: Callable[[], Any], cause: str
) -> None:
    folder = tmp_path / "ledger"
    with monkeypatch.context() as patch:
        patch.setattr(os, "getpid", lambda: PEER_PID)
        Ledger(folder, host_device(), job="a-peer").publish(memory=7 * M)
    probe = _Lister(listing)
    shared = SharedDevice(folder, job="b-job")
    adaptive, said = _fit(probe, shared, root=tmp_path)
    assert len(said) == 1 and "_Lister cannot list" in said[0] and cause in said[0], said
    assert probe.listed == 1 and adaptive.controller.peer_memory == 7 * M
    assert len(adaptive.decisions) == STEPS  # the ladder read on


@pytest.mark.slow
def test_under_ddp_one_ranks_failing_probe_makes_every_rank_skip_the_same_checks(tmp_path: Path) -> None:
    # rank 1's probe fails at its reads 2-3, then for good from read 6 (stopped after 3 in a row):
    # it still meets rank 0's collective at every check, so neither rank hangs, and both skip alike
    ranks = run_ddp_script(Path(__file__).with_name("ddp_probe_fault_script.py"), tmp_path)
    assert ranks[0]["steps"] == ranks[1]["steps"] == 12  # trained to the end on both ranks
    assert ranks[0]["checks"] == ranks[1]["checks"] == [1, 2, 5, 6]  # reads 0, 1, 4, 5 agreed
    assert ranks[1]["probe_stopped"] and not ranks[0]["probe_stopped"]
