"""The main job (README command 1) end to end on a tiny budget."""

import json
from pathlib import Path

import pytest

from lightning_bandlimit.main_job import main

ATTACK = ["--limit", "16", "--heat_map_limit", "4", "--sanity_samples", "8", "--progress", "false",
          "--data.init_args.test_size", "16", "--attacks", '[{name: fgsm, eps: [0, 0.03]}, {name: band_noise, eps: [0, 0.03], band: high}]']
TINY = ["--trainer.max_epochs", "1", "--data.train_size", "48", "--data.val_size", "16",
        "--data.batch_size", "16", "--model.width", "4", "--trainer.enable_progress_bar", "false"]


def test_trains_both_variants_and_writes_one_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = main(output_dir=str(tmp_path), overrides=TINY, robustness_overrides=ATTACK)
    assert run_dir.parent == tmp_path and run_dir.name.startswith("main-")
    summary = json.loads((run_dir / "summary.json").read_text())
    variants = {r["variant"]: r for r in summary["results"]}
    assert set(variants) == {"band-limited", "full-spectrum"}
    banded, plain = variants["band-limited"], variants["full-spectrum"]
    assert banded["compression"] == 0.5 and 0.4 < banded["achieved_compression"] < 0.6
    assert banded["compression_changes"] == 0 and plain["compression_changes"] == 0  # roomy machine
    assert plain["compression"] == 0.0 and plain["achieved_compression"] == 0.0
    for result in (banded, plain):
        assert 0.0 <= result["val_accuracy"] <= 1.0 and result["step_ms"] > 0
        assert result["saved_activation_mib"] > 0
        assert Path(result["checkpoint"]).is_file()
        assert (Path(result["log_dir"]) / "metrics.csv").is_file()
    # memory-lean band-limiting keeps less than the plain model, which is the reference
    assert plain["saved_vs_full_spectrum"] == 1.0 and banded["saved_vs_full_spectrum"] < 0.8
    out = capsys.readouterr().out
    assert str(run_dir) in out and "band-limited" in out and "full-spectrum" in out
    # ends with the robustness recipe on both checkpoints, its summary table printed
    records = json.loads((run_dir / "robustness" / "results.json").read_text())["records"]
    assert {r["model"] for r in records} == {"band-limited", "full-spectrum"}
    assert (run_dir / "robustness" / "summary.md").read_text().strip().splitlines()[0] in out


def test_unknown_recipe_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="recipe"):
        main(recipe="nope", output_dir=str(tmp_path))
    assert not any(tmp_path.iterdir())
