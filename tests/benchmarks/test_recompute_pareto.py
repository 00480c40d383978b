"""The checkpointing Pareto benchmark's pieces, run tiny (``benchmarks/memory/recompute_pareto.py``)."""

import inspect
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.memory import recompute_pareto as rp


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    """One intra-op thread: these steps are tiny, and two threads on a busy machine wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _point(series: str, label: str, mib: float | None, ratio: float | None) -> dict:
    return {
        "series": series,
        "label": label,
        "bytes_freed": None if mib is None else int(mib * rp.MIB),
        "time_ratio": ratio,
    }


def test_dominated_means_at_least_as_many_bytes_in_less_time() -> None:
    ours = _point("ours (cost order)", "rung 1", 10, 1.2)
    others = [
        _point("torch checkpoint", "more bytes, faster", 12, 1.1),
        _point("torch checkpoint", "same bytes, faster", 10, 1.19),
        _point("torch checkpoint", "same bytes, same time", 10, 1.2),
        _point("torch checkpoint", "fewer bytes, faster", 9, 1.0),
        _point("torch checkpoint", "more bytes, slower", 20, 1.3),
        _point("torch.compile", "bytes unknown", None, 0.5),
    ]
    assert rp.dominated_by(ours, others) == [
        "torch checkpoint more bytes, faster",
        "torch checkpoint same bytes, faster",
    ]
    assert rp.dominated_by(ours, others[2:]) == []
    assert rp.dominated_by(_point("ours (cost order)", "rung 1", None, 1.2), others) == []


def test_recompute_floor_counts_a_pointwise_move_without_its_layers() -> None:
    seconds, layers = {"a": 0.4, "b": 0.2}, {"a": 0.3, "b": 0.15}
    assert rp.recompute_floor(None, seconds, layers, 1.0) is None
    assert rp.recompute_floor({"a": "full"}, seconds, layers, 2.0) == pytest.approx(0.2)
    floor = rp.recompute_floor({"a": "full", "b": "pointwise"}, seconds, layers, 1.0)
    assert floor == pytest.approx(0.4 + 0.05)


class _Concat(nn.Module):
    """A DenseNet-like layer: takes a list of features (which its caller appends to afterwards)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return torch.relu(self.conv(torch.cat(features, 1)))


@pytest.mark.parametrize("selective", [False, True])
def test_torch_wrappers_freeze_list_arguments_and_keep_the_gradients(selective: bool) -> None:
    torch.manual_seed(0)
    layer = _Concat()
    x = torch.randn(2, 4, 5, 5, requires_grad=True)

    def run() -> torch.Tensor:
        features = [x]
        out = layer(features)
        features.append(out)  # what the recompute must not see
        out.sum().backward()
        return x.grad.clone()

    expected = run()
    x.grad = None
    enter, leave = rp.wrap_units([layer], selective)
    enter()
    assert "forward" in layer.__dict__
    got = run()
    leave()
    assert "forward" not in layer.__dict__
    torch.testing.assert_close(got, expected)


def test_compile_is_recorded_unavailable_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp.shutil, "which", lambda _: None)
    configs, info = rp.compiled_configs(nn.Linear(2, 2), [1.0], lambda _: None, 10.0)
    assert (
        configs == [] and not info["available"] and info["reason"].startswith("unavailable: no C++ compiler")
    )


@pytest.mark.parametrize("statistic", ["median", "min"])
def test_a_tiny_model_gives_every_series_and_checks(statistic: str) -> None:
    result = rp.measure_model(
        "quickstart",
        rp.QUICK,
        batch=4,
        rounds=2,
        steps=1,
        warmup=1,
        budgets=(),
        log=lambda _: None,
        statistic=statistic,
    )
    assert result["statistic"] == statistic and result["plain_round_spread"] >= 1.0
    points = result["points"]
    series = {p["series"] for p in points}
    assert {"plain", rp.OURS[0], rp.OURS[2], rp.TORCH_CHECKPOINT, rp.TORCH_SELECTIVE} <= series
    assert series <= {"plain", *rp.OURS, rp.TORCH_CHECKPOINT, rp.TORCH_SELECTIVE}
    plain = points[0]
    assert plain["series"] == "plain" and plain["bytes_freed"] == 0 and plain["time_ratio"] == 1.0
    # the meter sees what the checkpoints hold (torch saves their inputs through the hooks)
    assert all(p["held_bytes"] == 0 for p in points)
    cost = [p for p in points if p["series"] == rp.OURS[0]]
    stages = [p for p in points if p["series"] == rp.OURS[2]]
    assert [p["rung"] for p in cost] == list(range(1, len(result["rungs"][rp.OURS[0]]) + 1))
    assert len(stages) == len(result["rungs"][rp.OURS[2]]) == 4
    everything = next(p for p in points if p["label"] == f"first {result['units']}/{result['units']}")
    assert everything["series"] == rp.TORCH_CHECKPOINT
    assert everything["bytes_freed"] > cost[0]["bytes_freed"] > 0
    # the top rungs checkpoint every unit in full: the same bytes as torch's checkpoint on all
    for top in (cost[-1], stages[-1]):
        assert abs(top["bytes_freed"] - everything["bytes_freed"]) <= 0.01 * result["plain_saved_bytes"]
    # more rungs free more
    assert all(a["bytes_freed"] <= b["bytes_freed"] for a, b in zip(cost, cost[1:]))
    assert all(p["floor"] > 0 for p in cost + stages)
    checks = result["checks"]
    assert len(checks) == sum(p["series"] in rp.OURS for p in points) >= len(cost) + len(stages)
    assert {"dominated", "dominated_by", "floor_ratio", "floor_ok", "dominated_vs_eager_plain"} <= set(
        checks[0]
    )
    assert result["compile"]["available"] is False


def test_quick_run_writes_the_json_and_the_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "pareto.json"
    rp.main(["--quick", "--output", str(output)])
    document = json.loads(output.read_text())
    assert {"args", "torch", "threads", "models", "verdicts", "floor_source"} <= set(document)
    model = document["models"]["quickstart"]
    assert {"points", "checks", "compile", "rungs", "planned_savings_mib"} <= set(model)
    assert {rp.OURS[0], rp.OURS[2]} <= set(document["verdicts"]) <= set(rp.OURS)
    assert document["verdicts"][rp.OURS[0]]["pareto"] in ("PASS", "FAIL")
    assert output.with_suffix(".png").stat().st_size > 0
    output.with_suffix(".png").unlink()
    assert rp.main(["--plot-only", "--output", str(output)])["models"].keys() == {"quickstart"}
    assert output.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "ours (cost order)" in printed and ("PASS" in printed or "FAIL" in printed)


def test_checkpoint_inputs_records_what_checkpoints_hold_and_keeps_the_signature() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    original = torch.utils.checkpoint.checkpoint
    with rp.checkpoint_inputs() as held:
        assert torch.utils.checkpoint.checkpoint is not original
        assert "respect_saved_tensors_hooks" in str(inspect.signature(torch.utils.checkpoint.checkpoint))
        torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=False).sum().backward()
    assert held == {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()}
    assert torch.utils.checkpoint.checkpoint is original
