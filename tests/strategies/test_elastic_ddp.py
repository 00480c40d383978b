"""ElasticDDPStrategy with real gloo processes resized through checkpoint-restart.

Every launch runs ``elastic_run_script.py`` in a subprocess (Lightning starts the other ranks);
each rank reports the indices it trained on, the LR, and the strategy's state per step. Launches
are the suite's cost, so three runs are made once per module (``one_rank_run``, ``two_rank_run``
and ``resized_to_one_run``: the second resumed on 1 process, where both halves of the 2 -> 1 -> 2
resize start) and each test resumes a copy of one; the refusals of an incompatible
checkpoint are unit-tested in ``test_elastic_refusals.py``, with one end-to-end launch here.
"""

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _helpers import run_python

from lightning_bandlimit.strategies import ElasticDDPStrategy, ExactGlobalBatch, lr_multiplier

# its module-scoped runs are made once: the module on one xdist worker
pytestmark = pytest.mark.xdist_group("test_elastic_ddp")

SCRIPT = Path(__file__).with_name("elastic_run_script.py")
DATASET, BATCH, BASE_LR = 96, 8, 0.1
TOTAL = 3 * DATASET


def _launch(
    out: Path, tag: str, devices: int, max_steps: int, expect_ok: bool = True, **cfg: object
) -> subprocess.CompletedProcess:
    config = {"devices": devices, "max_steps": max_steps, "out": str(out), "tag": tag, **cfg}
    return run_python(str(SCRIPT), json.dumps(config), cwd=out, expect_ok=expect_ok or None, timeout=240)


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 process, 4 steps (linear rule, SGD): checkpoints at steps 2 and 4 (``last``), records ``a``."""
    out = tmp_path_factory.mktemp("one_rank_run")
    _launch(out, "a", devices=1, max_steps=4, every=2)
    return out


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 processes, 4 steps (linear rule, SGD; 64 samples of epoch 0): checkpoint at step 4, records ``a``."""
    out = tmp_path_factory.mktemp("two_rank_run")
    _launch(out, "a", devices=2, max_steps=4)
    return out


def _copy(run: Path, to: Path) -> Path:
    """A copy of a shared first run for a test to resume (and write into)."""
    shutil.copytree(run, to, dirs_exist_ok=True)
    return to


def _ranks(out: Path, tag: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{tag}-rank*.json"))]


def _steps(records: list[dict], before: float = math.inf) -> list[dict]:
    """Per-rank step records of one launch, up to (not including) global step ``before``."""
    return [t for r in records for t in r["trained"] if t["step"] < before]


def _check_curve(steps: list[dict], scale_of_world: dict[int, float]) -> None:
    """LR = reference LR x rule factor x cosine(samples seen before the step)."""
    for t in steps:
        seen_before = t["samples_seen"] - t["world_size"] * BATCH
        expected = (
            BASE_LR * scale_of_world[t["world_size"]] * lr_multiplier(seen_before, TOTAL, min_lr_ratio=0.1)
        )
        assert t["lr"] == pytest.approx(expected, rel=1e-6), t


# first of the tests on ``two_rank_run`` (which the first test to use pays for): the resize
# tests after it pay only for ``resized_to_one_run``
@pytest.mark.slow
def test_keep_global_batch_accumulates_on_fewer_ranks(tmp_path: Path, two_rank_run: Path) -> None:
    _copy(two_rank_run, tmp_path)  # planned on 2 ranks: a global batch of 16
    _launch(tmp_path, "b", devices=1, max_steps=6, rule="keep", every=2, resume="last")
    (b,) = _ranks(tmp_path, "b")
    assert b["applied"]["accumulation"] == 2 and b["applied"]["lr"] == pytest.approx(BASE_LR)
    steps = b["trained"]
    assert {t["accumulation"] for t in steps} == {2}
    # 2 optimizer steps x 2 micro-batches: the global batch stays 16 samples per step
    assert len(steps) == 4 and [t["step"] for t in steps] == [4, 4, 5, 5]
    assert steps[-1]["samples_seen"] == 6 * 16


@pytest.fixture(scope="module")
def resized_to_one_run(tmp_path_factory: pytest.TempPathFactory, two_rank_run: Path) -> Path:
    """``two_rank_run`` resumed on 1 process to step 14 (``b``): checkpoints at steps 8 and 12."""
    out = _copy(two_rank_run, tmp_path_factory.mktemp("resized_to_one_run"))
    # 96 samples, batch 8: 6 global steps per epoch on 2 ranks, 12 on 1. Checkpoints every 4 steps.
    _launch(out, "b", devices=1, max_steps=14, resume="last")  # rest of epoch 0, 6 steps of epoch 1
    (out / "ckpt" / "last.ckpt").rename(out / "ckpt" / "step12.ckpt")
    return out


@pytest.mark.slow
def test_resize_2_to_1_to_2_exactly_once_on_the_curve(tmp_path: Path, resized_to_one_run: Path) -> None:
    _copy(resized_to_one_run, tmp_path)  # "a": epoch 0, 64 samples, checkpoint at step 4; "b" from it
    _launch(tmp_path, "c", devices=2, max_steps=18, resume=str(tmp_path / "ckpt" / "step12.ckpt"))
    a, b, c = (_ranks(tmp_path, tag) for tag in "abc")
    assert [len(x) for x in (a, b, c)] == [2, 1, 2]

    # the lineage a[:4] -> b[4:12] -> c[12:]: each epoch's samples exactly once
    lineage = _steps(a, 4) + _steps(b, 12) + _steps(c)
    for epoch in (0, 1):
        seen = sorted(i for t in lineage if t["epoch"] == epoch for i in t["indices"])
        assert seen == list(range(DATASET)), f"epoch {epoch}"

    # the rule (linear: LR x world / 2) and the schedule, continuous in samples seen
    assert b[0]["resized_from"] == 2 and c[0]["resized_from"] == 1
    _check_curve(lineage, {1: 0.5, 2: 1.0})
    assert {t["momentum"] for t in lineage} == {0.9}
    assert b[0]["reference"]["world_size"] == 2 and c[0]["reference"]["world_size"] == 2
    assert b[0]["applied"]["lr"] == pytest.approx(0.05) and c[0]["applied"]["lr"] == pytest.approx(0.1)
    # CPU threads: the cores shared by the local processes
    cores = len(os.sched_getaffinity(0))
    assert b[0]["threads"] == cores and {r["threads"] for r in a} == {max(1, cores // 2)}


@pytest.mark.slow
def test_resize_1_to_2_at_an_epoch_end_opens_the_next_epoch_as_before(
    tmp_path: Path, resized_to_one_run: Path
) -> None:
    # the second half of the 2 -> 1 -> 2 story: "b" resumed on 2 processes from its step 8
    _copy(resized_to_one_run, tmp_path)
    _launch(tmp_path, "d", devices=2, max_steps=12, resume=str(tmp_path / "ckpt" / "step=8.ckpt"))
    b, d = _ranks(tmp_path, "b"), _ranks(tmp_path, "d")
    assert len(d) == 2
    # resumed at the end of epoch 0 (1 -> 2): epoch 1 from its start, nothing of epoch 0 again
    assert {t["epoch"] for t in _steps(d)} == {1}
    first_of_epoch1 = sorted(i for t in _steps(b, 12) if t["epoch"] == 1 for i in t["indices"])
    d_first = sorted(i for t in _steps(d, 10) for i in t["indices"])
    assert d_first == first_of_epoch1  # the same 32 samples open epoch 1 whatever the world size
    assert d[0]["resized_from"] == 1
    _check_curve(_steps(d), {1: 0.5, 2: 1.0})


@pytest.mark.slow
def test_stability_guard_rolls_back_a_bad_rule(tmp_path: Path, one_rank_run: Path) -> None:
    _copy(one_rank_run, tmp_path)  # no resize yet, so the first run's rule does not matter
    _launch(tmp_path, "b", devices=2, max_steps=40, rule="x1000", every=100, resume="last")
    b = _ranks(tmp_path, "b")
    rollbacks = b[0]["rollbacks"]
    assert rollbacks, "LR x 1000 should have diverged"
    assert [r["damping"] for r in rollbacks] == sorted((r["damping"] for r in rollbacks), reverse=True)
    assert all(r["retry"] == i + 1 for i, r in enumerate(rollbacks))
    assert b[0]["rollbacks"] == b[1]["rollbacks"]  # both ranks agreed on every rollback
    final = b[0]["trained"][-1]
    assert math.isfinite(final["loss"]) and final["loss"] < 2.0
    # the surviving LR is the damped one: 1000 ** damping times the reference
    damping = rollbacks[-1]["damping"]
    assert b[0]["applied"]["lr"] == pytest.approx(BASE_LR * 1000.0**damping)
    # the discarded steps' data is not given back, and the schedule stays in step with it
    assert b[0]["progress"][0] == pytest.approx(b[0]["trained"][-1]["samples_seen"])


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_at_one_step_with_a_checkpoint_to_resume(tmp_path: Path) -> None:
    # torchrun signals one agent's workers at a time; Lightning's own handler would desynchronise
    # the collectives here and tell the other ranks to exit 0 (a finished job, to their agents)
    proc = _launch(
        tmp_path, "a", devices=2, max_steps=50, every=100, sigterm_at=3, sigterm_rank=1, expect_ok=False
    )
    assert proc.returncode == 143, proc.stderr[-4000:]  # a failure to torchrun: it restarts the group
    assert "saved" in proc.stderr + proc.stdout and "on SIGTERM" in proc.stderr + proc.stdout
    a = _ranks(tmp_path, "a")
    assert [r["global_step"] for r in a] == [3, 3]  # both stopped at the next step boundary
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert (
        checkpoint["global_step"] == 3 and checkpoint["elastic_ddp"]["sampler"]["consumed"] == 3 * 2 * BATCH
    )
    _launch(tmp_path, "b", devices=1, max_steps=5, every=100, resume="last")  # resumed at another size
    (b,) = _ranks(tmp_path, "b")
    assert b["trained"][0]["step"] == 3 and b["resized_from"] == 2


@pytest.mark.slow
def test_ranks_that_resumed_different_checkpoints_stop_before_any_step(
    tmp_path: Path, one_rank_run: Path
) -> None:
    # each rank resolves ckpt_path="last" on its own; a write between them would split the group
    ckpt = _copy(one_rank_run, tmp_path) / "ckpt"
    before = sorted(p.name for p in ckpt.iterdir())
    proc = _launch(
        tmp_path,
        "b",
        devices=2,
        max_steps=8,
        every=1,
        resume=str(ckpt / "step=4.ckpt"),
        resume_rank1=str(ckpt / "step=2.ckpt"),
        expect_ok=False,
    )
    assert proc.returncode != 0
    assert "resumed different checkpoints" in proc.stderr and "[[4, 32], [2, 16]]" in proc.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == before  # nothing was written


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_incompatible_checkpoint_fails_before_writing(tmp_path: Path, one_rank_run: Path) -> None:
    # one refusal end to end (the last one checked, at training start, after every load); each
    # refusal's decision is unit-tested in test_elastic_refusals.py
    before = _snapshot(_copy(one_rank_run, tmp_path) / "ckpt")
    proc = _launch(tmp_path, "b", devices=2, max_steps=8, every=2, resume="last", expect_ok=False, batch=4)
    assert proc.returncode != 0 and "per-device batch" in proc.stderr, proc.stderr[-3000:]
    assert _snapshot(tmp_path / "ckpt") == before


@pytest.mark.slow
def test_adascale_measures_a_gain_between_1_and_the_scale(tmp_path: Path, one_rank_run: Path) -> None:
    _copy(one_rank_run, tmp_path)  # 1 process: no gradient statistics yet, whatever the rule
    _launch(tmp_path, "b", devices=2, max_steps=10, rule="adascale", resume="last", guard=False)
    b = _ranks(tmp_path, "b")
    gains = [t["gain"] for t in b[0]["trained"][1:]]  # the first step reports the gain before any statistics
    assert all(1.0 <= g <= 2.0 for g in gains) and len(set(gains)) > 1
    assert b[0]["noise"]["trace"] > 0
    # schedule progress advanced by gain x reference batch (8) per step, not by the 16 samples seen
    assert b[0]["progress"][0] < 10 * 16 and b[0]["applied"]["lr"] == pytest.approx(BASE_LR)


def test_registered_by_name_and_argument_checks() -> None:
    trainer = pl.Trainer(strategy="elastic_ddp", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, ElasticDDPStrategy)
    with pytest.raises(ValueError, match="per_device_batch"):
        ElasticDDPStrategy(per_device_batch=0)
    with pytest.raises(ValueError, match="cpu_threads"):
        ElasticDDPStrategy(cpu_threads=-1)
    with pytest.raises(TypeError, match="ScalingRule"):
        ElasticDDPStrategy(rule="linear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per_device_batch"):  # the rule chooses the micro-batch
        ElasticDDPStrategy(rule=ExactGlobalBatch(16, micro_batches=[8]), per_device_batch=8)
