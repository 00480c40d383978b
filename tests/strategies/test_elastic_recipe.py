"""The packaged ``elastic`` recipes: every launch resumes by itself, a resize rescales by rule or,
with ``elastic_exact``, keeps the global batch exactly."""

import shutil
from pathlib import Path

import pytest
import torch
from _helpers import run_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]  # starts processes (one or two launches a test: under 45 s alone, about 90 s beside busy workers)


def _fit(run: Path, devices: int, max_steps: int, config: str = "elastic", expect_ok: bool = True) -> str:
    args = [
        "-m",
        "lightning_bandlimit",
        "fit",
        "--config",
        config,
        "--trainer.default_root_dir",
        str(run),
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.devices",
        str(devices),
        "--trainer.max_steps",
        str(max_steps),
        "--trainer.accelerator",
        "cpu",
        "--trainer.callbacks.every_n_train_steps",
        "4",
        "--data.train_size",
        "256",
        "--data.val_size",
        "32",
    ]
    proc = run_python(*args, cwd=run.parent, expect_ok=expect_ok)
    return proc.stdout + proc.stderr


def test_relaunch_resumes_without_ckpt_path_and_rescales(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _fit(run, devices=1, max_steps=4)
    assert "no last checkpoint available" in first  # the first launch starts fresh
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    second = _fit(run, devices=2, max_steps=8)
    assert "Restored all states from the checkpoint" in second and "world size 1 -> 2" in second
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 8 and saved["elastic_ddp"]["world_size"] == 2
    assert saved["elastic_ddp"]["applied"]["lr"] == 2 * saved["elastic_ddp"]["reference"]["lr"]


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """``elastic_exact`` on 1 process (2 steps), then resumed on 2 (to step 4): the run, both outputs."""
    run = tmp_path_factory.mktemp("elastic_exact") / "run"
    first = _fit(run, devices=1, max_steps=2, config="elastic_exact")
    second = _fit(run, devices=2, max_steps=4, config="elastic_exact")
    return run, first, second


# the two launches of ``exact_run`` are made once: its tests on one xdist worker
@pytest.mark.xdist_group("test_elastic_recipe_exact")
def test_elastic_exact_keeps_the_global_batch(exact_run: tuple[Path, str, str]) -> None:
    run, first, second = exact_run
    assert "global batch 128 on 1 processes = micro-batch 32 x accumulation 4" in first
    assert "world sizes with an exact global batch of 128: [1, 2, 4]" in first
    assert "micro-batch 32 x accumulation 2" in second and "world size 1 -> 2" in second
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["elastic_ddp"]
    reference, applied = saved["reference"], saved["applied"]
    assert (reference["world_size"], reference["per_device_batch"], reference["accumulation"]) == (1, 32, 4)
    assert (applied["world_size"], applied["per_device_batch"], applied["accumulation"]) == (2, 32, 2)
    assert applied["lr"] == reference["lr"]  # the same global batch: nothing to rescale


@pytest.mark.xdist_group("test_elastic_recipe_exact")
def test_elastic_exact_refuses_an_inexact_world_size(
    tmp_path: Path, exact_run: tuple[Path, str, str]
) -> None:
    run = shutil.copytree(exact_run[0], tmp_path / "run")  # resized 1 -> 2 already; its own copy
    before = (run / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    refused = _fit(run, devices=3, max_steps=6, config="elastic_exact", expect_ok=False)
    assert "on 3 processes; valid world sizes: [1, 2, 4]" in refused
    assert (run / "checkpoints" / "last.ckpt").stat().st_mtime_ns == before  # nothing was written
