"""ElasticDDPStrategy: real gloo processes resized 2 -> 1 and 1 -> 2 through checkpoint-restart."""

import json
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_bandlimit.strategies import ElasticDDPStrategy

SCRIPT = Path(__file__).with_name("elastic_resize_script.py")


def _run(tmp_path: Path, devices: int, max_steps: int, resume: Path | None = None) -> dict:
    args = [sys.executable, str(SCRIPT), str(devices), str(max_steps), str(tmp_path)]
    if resume is not None:
        args.append(str(resume))
    proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"start-{devices}.json").read_text())


@pytest.mark.parametrize(("first", "second", "factor"), [(2, 1, 0.5), (1, 2, 2.0)])
def test_resize_through_checkpoint_applies_the_rule(tmp_path: Path, first: int, second: int, factor: float) -> None:
    start = _run(tmp_path, first, 4)
    assert start["resized_from"] is None and start["lr"] == pytest.approx(0.1)
    ckpt = tmp_path / f"after-{first}.ckpt"
    saved = torch.load(ckpt, weights_only=False)["elastic_ddp"]
    assert saved["world_size"] == first and saved["reference"]["lr"] == pytest.approx(0.1)
    assert saved["samples_seen"] == 4 * first * 8

    resumed = _run(tmp_path, second, 8, resume=ckpt)
    assert resumed["resized_from"] == first and resumed["world_size"] == second
    assert resumed["lr"] == pytest.approx(0.1 * factor)  # linear rule, applied after the restore
    assert resumed["reference_lr"] == pytest.approx(0.1) and resumed["reference_world_size"] == first
    assert resumed["momentum"] == pytest.approx(0.9)
    assert resumed["samples_seen"] == 4 * first * 8


def test_registered_by_name_and_argument_check() -> None:
    trainer = pl.Trainer(strategy="elastic_ddp", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, ElasticDDPStrategy)
    with pytest.raises(ValueError, match="per_device_batch"):
        ElasticDDPStrategy(per_device_batch=0)
