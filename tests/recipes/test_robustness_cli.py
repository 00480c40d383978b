"""The robustness recipe's checkpoints, main-job runs and command line (one-line errors, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from _helpers import cpu_trainer
from torch import nn
from torchattacks.attack import Attack

from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.layers.band_limited import BandLimitedConv2d
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recipes.evaluation.loading import load_classifier
from lightning_bandlimit.recipes.results.sanity import SanityCheckError
from lightning_bandlimit.recipes.robustness import main
from lightning_bandlimit.recipes.threats import (
    THREAT_FULL,
    AttackInfo,
    AttackSpec,
    registered_attack,
    validate_attack_specs,
)
from lightning_bandlimit.utils.main_run import main_run_checkpoints

# its module-scoped runs are made once: the module on one xdist worker
pytestmark = pytest.mark.xdist_group("test_robustness_cli")

PACKAGED = Path(__file__).resolve().parents[2] / "lightning_bandlimit" / "configs" / "robustness.yaml"
STUDY = PACKAGED.parent / "robustness_study.yaml"


def _checkpoint(folder: Path, callbacks: list[pl.Callback]) -> Path:
    torch.manual_seed(0)
    trainer = cpu_trainer(
        max_steps=2,
        limit_val_batches=1,
        default_root_dir=folder,
        callbacks=callbacks,
        enable_checkpointing=True,
    )
    trainer.fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=16, val_size=8, batch_size=8),
    )
    return Path(trainer.checkpoint_callback.best_model_path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "band-limited": _checkpoint(root / "bl", [BandLimit(0.5, exclude="backbone.8")]),
        "full-spectrum": _checkpoint(root / "fs", []),
    }


def test_checkpoints_are_band_limited_as_trained(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    limited = load_classifier(checkpoints["band-limited"])
    assert not limited.training
    assert type(limited.backbone[0]) is BandLimitedConv2d and limited.backbone[0].compression == 0.5
    assert type(limited.backbone[8]) is nn.Conv2d  # excluded when trained, excluded now
    plain = load_classifier(str(checkpoints["full-spectrum"]))
    assert not any(isinstance(m, BandLimitedConv2d) for m in plain.modules())
    adaptive = _checkpoint(tmp_path, [AdaptiveBandLimit(compression=0.3, min_compression=0.3)])
    assert load_classifier(adaptive).backbone[4].compression == 0.3
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        load_classifier(tmp_path / "nope.ckpt")


def _fake_main_run(runs: Path, checkpoints: dict[str, Path], stamp: str) -> Path:
    run_dir = runs / f"main-{stamp}"
    run_dir.mkdir(parents=True)
    results = [{"variant": v, "checkpoint": str(p)} for v, p in checkpoints.items()]
    (run_dir / "summary.json").write_text(json.dumps({"results": results}))
    return run_dir


def test_main_run_checkpoints(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    _fake_main_run(tmp_path, {"band-limited": checkpoints["full-spectrum"]}, "20240101-000000")
    newest = _fake_main_run(tmp_path, checkpoints, "20250101-000000")
    assert main_run_checkpoints("latest", tmp_path) == checkpoints
    assert main_run_checkpoints(newest / "summary.json") == checkpoints
    with pytest.raises(FileNotFoundError, match="no main-job run"):
        main_run_checkpoints("latest", tmp_path / "empty")


@pytest.mark.slow
def test_cli_end_to_end(
    tmp_path: Path, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_main_run(tmp_path / "runs", checkpoints, "20250101-000000")
    config = {
        "main_run": "latest",
        "runs_dir": str(tmp_path / "runs"),
        "models": {"again": str(checkpoints["full-spectrum"])},
        "data": {"class_path": "SyntheticImageDataModule", "init_args": {"test_size": 16, "batch_size": 8}},
        "attacks": [{"name": "fgsm", "eps": [0, "8/255"]}, {"name": "gaussian_noise", "eps": [0, 0.05]}],
        "limit": 8,
        "heat_map_limit": 2,
        "progress": False,
        "strict": False,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    out = main(["--config", str(path), "--seed", "1"])
    assert out == tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {"results.json", "results.csv", "accuracy_vs_eps.png", "summary.md"} <= names
    for model in ("band-limited", "full-spectrum", "again"):
        assert {f"heat_map_{model}.png", f"heat_map_{model}.npy"} <= names
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 1 and results["n_samples"] == 8 and len(results["records"]) == 3 * 4
    assert results["config"]["models"]["band-limited"]["band_limited_layers"] == 2
    assert results["config"]["models"]["full-spectrum"]["band_limited_layers"] == 0
    printed = capsys.readouterr().out
    assert "# Robustness evaluation" in printed and "| band-limited | fgsm |" in printed


@pytest.mark.slow
def test_cli_replicates_and_a_model_band(
    tmp_path: Path, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    limited, full = str(checkpoints["band-limited"]), str(checkpoints["full-spectrum"])
    out = main(
        [
            "--models",
            json.dumps({"band-limited": [limited, limited], "full-spectrum": [full, full]}),
            "--data",
            "SyntheticImageDataModule",
            "--data.test_size",
            "8",
            "--limit",
            "8",
            "--attacks",
            "[{name: band_noise, eps: [0, 0.1], band: dropped}]",
            "--output_dir",
            str(tmp_path / "out"),
            "--heat_map_limit",
            "2",
            "--progress",
            "false",
            "--strict",
            "false",
        ]
    )
    records = json.loads((out / "results.json").read_text())["records"]
    assert {(r["variant"], r["replicate"]) for r in records} == {
        ("band-limited", 0),
        ("band-limited", 1),
        ("full-spectrum", 0),
        ("full-spectrum", 1),
    }
    assert {r["band_source"] for r in records} == {"band-limited"}
    assert (out / "heat_map_difference.png").is_file()
    printed = capsys.readouterr().out
    assert "* **dropped-band noise** (Linf):" in printed


def _cli_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """The one line a bad value prints (after checking the exit status 2 and that it is one line)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lightning-bandlimit robustness: error: "), err
    return lines[0]


def test_cli_errors(tmp_path: Path, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert "expected models to evaluate" in _cli_error(
        capsys, ["--data", "SyntheticImageDataModule", "--attacks", "[{name: fgsm, eps: [0.1]}]"]
    )
    assert "unknown attack 'fgs'" in _cli_error(
        capsys,
        [
            "--models",
            json.dumps({"m": str(checkpoints["full-spectrum"])}),
            "--data",
            "SyntheticImageDataModule",
            "--attacks",
            "[{name: fgs, eps: [0.1]}]",
            "--output_dir",
            str(tmp_path / "out"),
        ],
    )
    assert not (tmp_path / "out").exists()
    assert "recipes:" in _cli_error(capsys, ["--config", "no-such-recipe"])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("eps", "attack 'pgd': an L-inf eps above 1 exceeds the [0, 1] image range, got 2.0"),
        ("model_file", "checkpoint not found: '"),
        ("config_key", "nosuchkey"),
        ("type", "Parser key \"limit\": Expected a <class 'int'>; Given value: many"),
        ("heat_map_eps", "heat_map_eps must be > 0, got -1.0"),
        ("attack_field", "(unknown: nme)"),
    ],
)
def test_cli_bad_values_end_in_one_line(
    tmp_path: Path, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    models = {"m": str(checkpoints["full-spectrum"])}
    attacks = "[{name: pgd, eps: [0.1]}]"
    extra: list[str] = []
    if case == "eps":
        attacks = "[{name: pgd, eps: [2]}]"
    elif case == "model_file":
        models = {"m": str(tmp_path / "missing.ckpt")}
    elif case == "config_key":
        config = tmp_path / "bad.yaml"
        config.write_text(yaml.safe_dump({"limit": 8, "nosuchkey": 3}))
        extra = ["--config", str(config)]
    elif case == "type":
        extra = ["--limit", "many"]
    elif case == "heat_map_eps":
        extra = ["--heat_map_eps", "-1"]
    elif case == "attack_field":
        attacks = "[{nme: pgd, eps: [0.1]}]"
    out = tmp_path / "out"
    args = ["--models", json.dumps(models), "--data", "SyntheticImageDataModule", "--attacks", attacks]
    line = _cli_error(capsys, [*extra, *args, "--output_dir", str(out)])
    assert message in line
    if case == "model_file":
        assert "missing.ckpt" in line
    assert not out.exists()


@pytest.mark.slow
def test_command_line_error_and_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = [sys.executable, "-m", "lightning_bandlimit", "robustness"]
    bad = subprocess.run(
        [*command, "--data", "SyntheticImageDataModule", "--attacks", "[{name: pgd, eps: [0.1]}]"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines() == [
        "lightning-bandlimit robustness: error: expected models to evaluate: pass --models '{name: "
        "checkpoint}' and/or --main_run PATH|latest"
    ]
    with pytest.raises(SystemExit) as helped:  # the help text is the parser's: no process needed
        main(["--help"])
    out = capsys.readouterr().out
    assert helped.value.code == 0 and "--heat_map_eps" in out and "--main_run" in out


@pytest.mark.slow
def test_cli_strict_exits_after_writing(
    tmp_path: Path,
    checkpoints: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Broken(Attack):
        def __init__(self, model: nn.Module, eps: float) -> None:
            super().__init__("Broken", model)

        def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return torch.rand_like(images)

    info = AttackInfo(
        "broken", lambda model, eps, **_: Broken(model, eps), "Linf", THREAT_FULL, True, "radius"
    )
    with registered_attack(info):
        out = tmp_path / "out"
        with pytest.raises(SanityCheckError, match="FAIL budget"):
            main(
                [
                    "--models",
                    json.dumps({"m": str(checkpoints["full-spectrum"])}),
                    "--data",
                    "SyntheticImageDataModule",
                    "--data.test_size",
                    "8",
                    "--attacks",
                    "[{name: broken, eps: [0]}]",
                    "--output_dir",
                    str(out),
                    "--heat_map",
                    "false",
                    "--progress",
                    "false",
                ]
            )
        assert (out / "summary.md").is_file() and "**FAIL**" in capsys.readouterr().out


def test_packaged_recipe_is_valid() -> None:
    lines = PACKAGED.read_text().splitlines()
    assert lines[0].startswith("# ") and "robustness" in lines[0]
    config = yaml.safe_load(PACKAGED.read_text())
    specs = validate_attack_specs([AttackSpec(**a) for a in config["attacks"]])
    names = {s.name for s in specs}
    assert {"fgsm", "pgd", "pgd_l2", "cw", "autoattack", "gaussian_noise", "band_pgd", "band_noise"} <= names
    assert all(0.0 in s.eps for s in specs)  # every attack runs the eps = 0 check
    assert config["main_run"] == "latest" and config["data"]["class_path"].endswith(
        "SyntheticImageDataModule"
    )
    quickstart = yaml.safe_load((PACKAGED.parent / "quickstart.yaml").read_text())
    assert config["data"]["init_args"] == quickstart["data"]["init_args"]
    # the band threat models are the band-limited model's own: what it drops and what it keeps
    assert {s.band for s in specs if s.name.startswith("band_")} == {"dropped", "kept", "full"}


def test_packaged_study_is_valid() -> None:
    config = yaml.safe_load(STUDY.read_text())
    specs = validate_attack_specs([AttackSpec(**a) for a in config["attacks"]])
    assert all(0.0 in s.eps for s in specs if s.name != "autoattack")
    bands = {(s.name, s.band, s.options.get("norm", "Linf")) for s in specs if s.name.startswith("band_")}
    for band in ("dropped", "kept", "full"):
        assert {("band_noise", band, "Linf"), ("band_noise", band, "L2")} <= bands
    assert {("band_pgd", "dropped", "Linf"), ("band_pgd", "kept", "Linf")} <= bands
    assert config["data"] == yaml.safe_load(PACKAGED.read_text())["data"]
