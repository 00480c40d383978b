"""Parity: a run resized 1 -> 2 -> 1 with ExactGlobalBatch trains like the fixed-size run.

Real gloo processes, resized through checkpoint-restart (``exact_batch_script.py``), in float64.
The fixed run is one process for the whole run; the resized run is one process for steps 0-2,
two processes for steps 3-6 and one again from step 7 (crossing the epoch boundary at step 8).
Its first phase would train exactly the fixed run's first steps, so the resized run resumes the
fixed run's own checkpoint at step 3 instead of launching it again (one launch fewer per run).

**Tolerance: 1e-10, relative on the per-step loss and absolute on the final weights.** Both runs
average the gradients of exactly the same samples in every step; they differ only in the order
of the floating-point additions (one process sums ``a`` micro-batch gradients each scaled by
``1/a``; two processes' gradients are summed by gloo's all-reduce and divided by 2). In float64
each such addition is exact to about 1e-16 relative, and 12 SGD steps amplify that by far less
than 1e6, so 1e-10 is reduction-order noise with room to spare. Any real difference (one other
sample in a step, a rescaled LR, BatchNorm statistics over another batch) moves the loss by
1e-4 or more; the BatchNorm test below shows such a difference being caught.
"""

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from _helpers import run_python

pytestmark = [
    pytest.mark.slow,  # real gloo processes, two or three launches a test
    pytest.mark.timeout(600),  # up to 200 s beside four busy xdist workers
]

SCRIPT = Path(__file__).with_name("exact_batch_script.py")
TOLERANCE = 1e-10
TOTAL_STEPS = 12
RESIZED = [(1, 3), (2, 7), (1, TOTAL_STEPS)]  # (processes, run until this global step)
_BATCHNORM_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _launch(out: Path, tag: str, devices: int, max_steps: int, **cfg: object) -> None:
    config = {"devices": devices, "max_steps": max_steps, "out": str(out), "tag": tag, **cfg}
    config.setdefault("max_total_steps", TOTAL_STEPS)
    run_python(str(SCRIPT), json.dumps(config), cwd=out)


def _run(
    out: Path, phases: list[tuple[int, int]], first: Path | None = None, **cfg: object
) -> tuple[dict[int, dict], dict]:
    """Launch the phases in ``out``; per global step: the samples, the mean loss, the layouts.

    ``first``: the folder of a one-process run of the same configuration (checkpointed every
    step), which stands in for the first phase: its checkpoint at that phase's end is resumed and
    its records up to there are this run's (the first phase would train the very same steps).
    """
    out.mkdir()
    records = []
    resume = None
    if first is not None:
        (devices, until), phases = phases[0], phases[1:]
        assert devices == 1
        (out / "ckpt").mkdir()
        resume = str(shutil.copy(first / "ckpt" / f"step={until}.ckpt", out / "ckpt"))
        for path in sorted(first.glob("phase0-rank*.json")):
            trained = json.loads(path.read_text())["trained"]
            records.append([micro for micro in trained if micro["step"] < until])
    for i, (devices, until) in enumerate(phases):
        _launch(out, f"phase{i}", devices, until, resume=resume if i == 0 else "last", **cfg)
    records += [json.loads(path.read_text())["trained"] for path in sorted(out.glob("phase*-rank*.json"))]
    steps: dict[int, dict] = defaultdict(lambda: {"indices": [], "losses": [], "layouts": set()})
    for trained in records:
        for micro in trained:
            step = steps[micro["step"]]
            step["indices"] += micro["indices"]
            step["losses"].append(micro["loss"])
            step["layouts"].add((micro["world_size"], len(micro["indices"]), micro["accumulation"]))
            step.setdefault("lr", set()).add(micro["lr"])
    final = torch.load(out / f"phase{len(phases) - 1}-final.pt")
    return dict(steps), final


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)  # every micro-batch of a step has the same size


def _assert_parity(fixed: tuple[dict, dict], resized: tuple[dict, dict], buffers: bool = True) -> None:
    (fixed_steps, fixed_final), (steps, final) = fixed, resized
    assert sorted(steps) == sorted(fixed_steps) == list(range(TOTAL_STEPS))
    for s in range(TOTAL_STEPS):
        assert sorted(steps[s]["indices"]) == sorted(fixed_steps[s]["indices"]), f"step {s}: other samples"
        lrs = steps[s]["lr"] | fixed_steps[s]["lr"]
        assert max(lrs) == pytest.approx(min(lrs), rel=TOLERANCE), f"step {s}: learning rates {lrs}"
        loss, expected = _mean(steps[s]["losses"]), _mean(fixed_steps[s]["losses"])
        assert loss == pytest.approx(expected, rel=TOLERANCE), f"step {s}: loss {loss} vs fixed {expected}"
    assert final.keys() == fixed_final.keys()
    for name, tensor in final.items():
        if not buffers and name.split(".")[-1] in _BATCHNORM_BUFFERS:
            continue
        difference = (tensor.double() - fixed_final[name].double()).abs().max().item()
        assert difference <= TOLERANCE, f"{name}: final weights differ by {difference}"


def test_resized_run_follows_the_fixed_run_step_by_step(tmp_path: Path) -> None:
    cfg = {"global_batch": 32, "micro_batches": [8, 16]}
    fixed = _run(tmp_path / "fixed", [(1, TOTAL_STEPS)], **cfg)
    resized = _run(tmp_path / "resized", RESIZED, first=tmp_path / "fixed", **cfg)
    # one process: 16 x 2 accumulation; two processes: 16 x 1 each; the loader's own 8 is replaced
    assert fixed[0][0]["layouts"] == {(1, 16, 2)}
    assert resized[0][4]["layouts"] == {(2, 16, 1)} and resized[0][8]["layouts"] == {(1, 16, 2)}
    assert all(len(step["indices"]) == 32 for step in resized[0].values())
    _assert_parity(fixed, resized)


def test_batchnorm_follows_the_fixed_run_with_one_micro_batch_size(tmp_path: Path) -> None:
    # BatchNorm normalises each micro-batch on its own device. With one allowed micro-batch size the
    # micro-batches of a step hold the same samples at every world size (16 x 2 on one process,
    # 16 x 1 on each of two), so training follows the fixed run; the running statistics do not:
    # one process updates them twice per step, two processes once each and DDP keeps rank 0's.
    cfg = {"global_batch": 32, "micro_batches": [16], "batchnorm": True}
    fixed = _run(tmp_path / "fixed", [(1, TOTAL_STEPS)], **cfg)
    same_micro = _run(tmp_path / "same_micro", RESIZED, first=tmp_path / "fixed", **cfg)
    assert same_micro[0][4]["layouts"] == {(2, 16, 1)} and fixed[0][4]["layouts"] == {(1, 16, 2)}
    _assert_parity(fixed, same_micro, buffers=False)
    running = (same_micro[1]["net.1.running_mean"] - fixed[1]["net.1.running_mean"]).abs().max().item()
    assert running > 1e3 * TOLERANCE, f"running means agree to {running}: the comment above is out of date"


def test_batchnorm_leaves_the_fixed_run_with_two_micro_batch_sizes(tmp_path: Path) -> None:
    # Two micro-batch sizes: one process runs 32 x 1, two processes 16 x 1 each, so BatchNorm's
    # statistics come from other batches and the loss leaves the fixed run's curve at once.
    cfg = {"global_batch": 32, "micro_batches": [16, 32], "batchnorm": True}
    fixed = _run(tmp_path / "fixed32", [(1, RESIZED[1][1])], **cfg)
    changed = _run(tmp_path / "changed", RESIZED[:2], first=tmp_path / "fixed32", **cfg)
    assert fixed[0][4]["layouts"] == {(1, 32, 1)} and changed[0][4]["layouts"] == {(2, 16, 1)}
    first_resized = RESIZED[0][1]  # steps before it are the fixed run's own (its checkpoint is resumed)
    gaps = [
        abs(_mean(changed[0][s]["losses"]) / _mean(fixed[0][s]["losses"]) - 1)
        for s in range(first_resized, RESIZED[1][1])
    ]
    assert min(gaps) > 1e3 * TOLERANCE, f"BatchNorm over 16 instead of 32 samples: relative gaps {gaps}"
