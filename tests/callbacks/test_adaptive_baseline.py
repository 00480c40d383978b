"""AdaptiveBandLimit in a Trainer, beside a job whose own memory between steps grows (issue 55).

The probe measures the job as ``SharedBudget`` does: its peak on the step (``own``) and what it
held at the step's start (``own_base``); the job's baseline grows through the run (a cache
filling) and jumps once, while a co-tenant arrives within one step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _helpers import cpu_trainer

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.callbacks.ladder_reading import read_job
from lightning_bandlimit.callbacks.ladder_step_peak import StepPeak
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import MemoryReading, ScriptedProbe
from lightning_bandlimit.memory.protocol import MemoryProbe
from lightning_bandlimit.models import ImageClassifier

M = 1_000_000
TOTAL = 100 * M
# The job's step over its baseline per rung: each rung frees 70 %, 63 %, 64 % and 75 % of what its
# stage keeps for backward (cifar_resnet18 width 4, batch 16: 1.57, 0.79, 0.39 and 0.2 MB)
INCREMENTS = [5.0 * M, 3.9 * M, 3.4 * M, 3.15 * M, 3.0 * M]

pytestmark = pytest.mark.usefixtures("one_thread")


class _DriftingJob(MemoryProbe):
    """The budget beside a job whose baseline grows 0.3 MB a check to the 14th, then 0.4 MB at
    the 16th, and a co-tenant of 5 MB that takes 11.5 MB at the 10th: rung 1 fits the jump, rung
    2 the growth, rung 3 the step."""

    source = "scripted"
    measures_own = True

    def __init__(self) -> None:
        self.callback: AdaptiveBandLimit | None = None
        self.bases: list[int] = []

    def read(self) -> MemoryReading:
        assert self.callback is not None
        step = len(self.bases) + 1
        base = int(80 * M + 0.3 * M * min(step, 14) + (0.4 * M if step >= 16 else 0))
        own = base + int(INCREMENTS[self.callback.rung])
        cotenant = 11.5 * M if step >= 10 else 5 * M
        self.bases.append(base)
        return MemoryReading(TOTAL, max(0, int(TOTAL - own - cotenant)), self.source, own=own, own_base=base)


def test_a_growing_baseline_is_logged_said_once_and_takes_exact_rungs_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _DriftingJob()
    callback = AdaptiveBandLimit(
        probe=probe,
        min_free=0.6 * M,
        release_free=3 * M,
        check_every_n_steps=1,
        continuum_rung="zero",
        rung_order="stages",
    )
    probe.callback = callback
    trainer = cpu_trainer([callback], default_root_dir=tmp_path, max_steps=24, limit_val_batches=0)
    with caplog.at_level("INFO"):
        trainer.fit(
            ImageClassifier("cifar_resnet18", width=4),
            SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16),
        )
    assert all(d["compression"] == 0.0 for d in callback.decisions), callback.decisions
    assert max(d["rung"] for d in callback.decisions) >= 3  # the growth and the step needed rungs 2, 3
    assert callback.controller.top == 4  # no rung that frees memory judged idle
    measured = [d["baseline_bytes"] for d in callback.decisions]
    assert measured == probe.bases[: len(measured)]  # what each check read, kept with its decision
    assert "AdaptiveBandLimit/baseline_bytes" in trainer.callback_metrics
    assert caplog.text.count("the job's own memory between steps grew") == 1


def test_on_a_gpu_the_steps_start_is_what_was_allocated_there(monkeypatch: pytest.MonkeyPatch) -> None:
    allocated = {"now": 300, "peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocated.update(peak=300))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    meter, gpu = StepPeak(), torch.device("cuda", 0)
    meter.start(gpu, exclude=())
    allocated["peak"] = 900  # the step's activations came and went
    job = read_job(ScriptedProbe([500], total=1000), gpu, meter.bytes, meter.base)
    assert (job.peak, job.base) == (900, 300)
    host = read_job(ScriptedProbe([500], total=1000), torch.device("cpu"), 700, None)
    assert (host.peak, host.base) == (700, None)  # bytes saved for backward: an increment already


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_real_gpu_the_increment_leaves_what_the_job_holds_between_steps() -> None:
    gpu = torch.device("cuda", torch.cuda.current_device())
    held = torch.ones(2**20, device=gpu)  # 4 MiB held between steps
    meter = StepPeak()
    meter.start(gpu, exclude=())
    step = torch.ones(2**22, device=gpu)  # 16 MiB within the step
    del step
    job = read_job(ScriptedProbe([500], total=1000), gpu, meter.bytes, meter.base)
    assert job.base is not None and job.peak is not None
    assert job.base >= held.numel() * 4 and job.peak - job.base >= 2**24
