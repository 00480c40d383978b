"""The main job (README command 1) end to end on a tiny budget."""

import json
from pathlib import Path

import pytest

from lightning_bandlimit.main_job import main

# 32 sanity samples (the recipe's default): with 8, one sample the 10-step model gets right by
# luck under the large-budget PGD was 0.125 > chance and failed about one run in three.
ATTACK = [
    "--limit",
    "32",
    "--heat_map_limit",
    "4",
    "--sanity_samples",
    "32",
    "--progress",
    "false",
    "--data.init_args.test_size",
    "32",
    "--attacks",
    "[{name: fgsm, eps: [0, 0.03]}, {name: band_noise, eps: [0, 0.03], band: dropped}]",
]
TINY = [
    "--trainer.max_epochs",
    "1",
    "--data.train_size",
    "160",
    "--data.val_size",
    "16",
    "--data.batch_size",
    "16",
    "--model.width",
    "4",
]


def test_runs_the_multitenant_scenario_plain_then_memory_aware_and_attacks_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = main(output_dir=str(tmp_path), overrides=TINY, robustness_overrides=ATTACK)
    assert run_dir.parent == tmp_path and run_dir.name.startswith("main-")
    summary = json.loads((run_dir / "summary.json").read_text())
    variants = {r["variant"]: r for r in summary["results"]}
    assert set(variants) == {"band-limited", "full-spectrum"}
    banded, plain = variants["band-limited"], variants["full-spectrum"]
    assert (
        plain["mode"] == "plain" and plain["final_compression"] == 0.0 and plain["compression_changes"] == 0
    )
    assert (
        banded["mode"] == "adaptive" and banded["final_compression"] >= 0.5
    )  # the recipe's compression is its floor
    # the budget is chosen so that the plain job does not fit beside the co-tenant's peak
    assert plain["over_budget_steps"] >= 1 and plain["steps"] == banded["steps"] == 10
    timeline = json.loads((run_dir / "full-spectrum" / "result.json").read_text())["timeline"]
    assert len(timeline) == 10 and all(r["job_bytes"] > 0 and r["cotenant_bytes"] > 0 for r in timeline)
    needed = [r["job_bytes"] + r["cotenant_bytes"] for r in timeline]
    assert (
        min(needed) < summary["budget_bytes"] < max(needed)
    )  # fits before the co-tenant grows, not at its peak
    for result in (banded, plain):
        assert 0.0 <= result["val_accuracy"] <= 1.0 and result["step_ms"] > 0
        assert Path(result["checkpoint"]).is_file()
        assert (Path(result["log_dir"]) / "metrics.csv").is_file()
    assert banded["bn_recalibrations"] >= 1  # before validation
    assert (run_dir / "timeline.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert str(run_dir) in out and "band-limited" in out and "full-spectrum" in out and "over budget" in out
    # ends with the robustness recipe on both checkpoints, its summary table printed
    records = json.loads((run_dir / "robustness" / "results.json").read_text())["records"]
    assert {r["model"] for r in records} == {"band-limited", "full-spectrum"}
    assert (run_dir / "robustness" / "summary.md").read_text().strip().splitlines()[0] in out
    assert {r["band_source"] for r in records if r["attack_name"] == "band_noise"} == {"band-limited"}
    assert "* **dropped-band noise** (Linf):" in out and "(1 seed: no interval)" in out


def test_unknown_recipe_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="recipe"):
        main(recipe="nope", output_dir=str(tmp_path))
    assert not any(tmp_path.iterdir())
