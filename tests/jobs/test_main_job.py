"""The main job (README command 1) end to end on a tiny budget."""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_bandlimit.jobs.main_job import _cli, main
from lightning_bandlimit.jobs.multitenant.command import main as multitenant_main

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


@pytest.mark.slow
# Several training processes measuring each other's memory in /proc: one such test at a time
# (the main job's and the co-tenant jobs' tests, side by side under four busy workers, ran past 300 s).
@pytest.mark.xdist_group("multitenant-jobs")
@pytest.mark.timeout(600)
def test_runs_plain_the_ladder_and_compression_only_then_attacks_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = main(output_dir=str(tmp_path), overrides=TINY, robustness_overrides=ATTACK)
    assert run_dir.parent == tmp_path and run_dir.name.startswith("main-")
    summary = json.loads((run_dir / "summary.json").read_text())
    variants = {r["variant"]: r for r in summary["results"]}
    assert set(variants) == {"band-limited", "ladder", "full-spectrum"}
    banded, plain, ladder = variants["band-limited"], variants["full-spectrum"], variants["ladder"]
    assert [v["robustness"] for v in (banded, plain, ladder)] == [
        True,
        True,
        False,
    ]  # the ladder is not attacked
    # the ladder starts exact (compression 0) and measured its checkpointing rungs (the quickstart
    # ResNet's 8 blocks, cheapest bytes first, a few per rung: more rungs than its 4 stages, at
    # most 8); compression-only never checkpoints
    top = ladder["rungs"]
    assert ladder["mode"] == "adaptive" and 4 < top <= 8 and banded["rungs"] == 0
    ladder_timeline = json.loads((run_dir / "ladder" / "result.json").read_text())["timeline"]
    assert ladder_timeline[0]["compression"] == 0.0 and ladder_timeline[0]["checkpointed_units"] == 0
    for r in ladder_timeline:  # units only on a rung, all 8 on the top; compression only there
        assert (r["checkpointed_units"] > 0) == (r["rung"] > 0), r
        assert r["rung"] < top or r["checkpointed_units"] == 8, r
        assert r["compression"] == 0.0 or r["rung"] == top, r
    # the printed verdict is computed from the rows
    over = {v: variants[v]["over_budget_steps"] for v in variants}
    assert summary["verdict"][0] == (
        f"verdict: the plain job overdrew the budget at {over['full-spectrum']} of {plain['steps']} steps."
    )
    assert summary["verdict"][1].startswith(f"  ladder: {over['ladder']} over-budget steps;")
    assert summary["verdict"][2].startswith(f"  compression-only: {over['band-limited']} over-budget steps;")
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
    # what the run reports about its budget is what it measured, however much memory the machine has
    assert plain["over_budget_steps"] == sum(n > summary["budget_bytes"] for n in needed)
    # the memory-aware job changes its compression only where its budget check decided so (a raise
    # at step s is the compression of step s + 1); how often depends on the machine, not checked
    adaptive = json.loads((run_dir / "band-limited" / "result.json").read_text())["timeline"]
    changed = [
        i for i in range(1, len(adaptive)) if adaptive[i]["compression"] != adaptive[i - 1]["compression"]
    ]
    assert banded["compression_changes"] == len(changed)
    assert all(adaptive[i - 1]["decision"] in ("raise", "lower") for i in changed), adaptive
    for result in (banded, plain):
        assert 0.0 <= result["val_accuracy"] <= 1.0 and result["step_ms"] > 0
        assert Path(result["checkpoint"]).is_file()
        assert (Path(result["log_dir"]) / "metrics.csv").is_file()
    assert banded["bn_recalibrations"] >= 1  # before validation
    assert (run_dir / "timeline.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert str(run_dir) in out and "band-limited" in out and "full-spectrum" in out and "over budget" in out
    assert all(line in out for line in summary["verdict"])
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


# Bad values on the main job's command line (and its jobs'): one line and exit status 2, before any work.

MAIN_JOB = "python -m lightning_bandlimit.jobs.main_job: error: "


@pytest.mark.slow
def test_bad_value_is_one_line_from_the_module(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_bandlimit.jobs.main_job",
            "--budget_below",
            "2",
            "--output_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [MAIN_JOB + "budget_below must be in (0, 1), got 2.0"]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recipe", "nope"], "--recipe 'nope' is neither an existing file nor a recipe name; recipes: "),
        (["--cotenant_low_mib", "-5"], "cotenant_low_mib must be >= 0, got -5.0"),
        (["--cotenant_high_mib", "16"], "cotenant_high_mib must be >= 32.0, got 16.0"),
        (["--budget_below", "abc"], "--budget_below: Expected a <class 'float'>. Got value: abc"),
        (["--overrides", '[--trainer.max_epochs, "0"]'], "overrides: the jobs must train at least one step"),
        (["--overrides", '[--trainer.max_epochs, "-1"]'], "overrides: the jobs must end"),
        (
            ["--overrides", '[--trainer.callbacks.compression, "1.5"]'],
            "overrides: compression must be in [0, 1), got 1.5",
        ),
        (["--overrides", '[--nosuch, "1"]'], "overrides: unrecognized arguments: --nosuch 1"),
        (["--nosuch", "1"], "unrecognized arguments: --nosuch 1"),
    ],
)
def test_bad_values_end_in_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, error_line: Callable[[], str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli([*args, "--output_dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    assert error_line().startswith(MAIN_JOB + message)
    assert not any(tmp_path.iterdir())


def test_an_output_dir_that_is_a_file_is_one_line(tmp_path: Path, error_line: Callable[[], str]) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        _cli(["--output_dir", str(tmp_path / "file" / "runs")])
    assert exit_info.value.code == 2
    assert error_line() == (
        f"{MAIN_JOB}output_dir {str(tmp_path / 'file' / 'runs')!r} cannot be created: "
        f"{str(tmp_path / 'file')!r} is not a folder"
    )


def test_bad_overrides_fail_before_any_work_from_python(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"overrides: compression must be in \[0, 1\), got 1.5"):
        main(output_dir=str(tmp_path), overrides=["--trainer.callbacks.compression", "1.5"])
    assert not any(tmp_path.iterdir())


def _spec(tmp_path: Path, **fields: object) -> Path:
    spec = {"name": "job", "mode": "plain", "out_dir": str(tmp_path / "job"), "trace": {"low": 1, "high": 2}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**spec, **fields}))
    return path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "nope"}, "mode must be one of ['plain', 'checkpointed', 'fixed', 'adaptive'], got 'nope'"),
        ({"colour": "red"}, "unexpected keyword argument 'colour'"),
        ({"recipe": "nope"}, "--config 'nope' is neither an existing file nor a recipe name"),
        ({"overrides": ["--trainer.callbacks.compression", "1.5"]}, "compression must be in [0, 1), got 1.5"),
    ],
)
def test_a_bad_job_spec_is_one_line(
    fields: dict[str, object], message: str, tmp_path: Path, error_line: Callable[[], str]
) -> None:
    path = _spec(tmp_path, **fields)
    with pytest.raises(SystemExit) as exit_info:
        multitenant_main([str(path)])
    assert exit_info.value.code == 2
    line = error_line()
    assert (
        line.startswith(f"python -m lightning_bandlimit.jobs.multitenant: error: {path}: ")
        and message in line
    )
    assert not (tmp_path / "job" / "result.json").exists()


def test_a_missing_job_spec_is_one_line(tmp_path: Path, error_line: Callable[[], str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        multitenant_main([str(tmp_path / "none.json")])
    assert exit_info.value.code == 2
    assert error_line().endswith(f"{tmp_path / 'none.json'}: No such file or directory")
    with pytest.raises(SystemExit) as exit_info:
        multitenant_main([])  # argparse: usage, then the error on the last line
    assert exit_info.value.code == 2
    assert error_line().endswith("error: the following arguments are required: spec")
