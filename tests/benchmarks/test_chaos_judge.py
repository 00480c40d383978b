"""The chaos soak's judgement (``benchmarks/faults/chaos_judge.py``) catches each flaw it is there for.

Histories are written as the soak's workers write them (one JSON-lines file per generation and
rank), with 8 samples, a global batch of 4 in micro-batches of 2: 2 steps per epoch.
"""

import json
from pathlib import Path

from benchmarks.faults.chaos_judge import judge, read_generations

DATASET, GLOBAL, MICRO, STEPS = 8, 4, 2, 4
# the uninterrupted run's samples per step (epoch 0: a permutation, epoch 1: another)
ORDER = [[3, 1, 7, 0], [2, 6, 4, 5], [5, 0, 2, 7], [1, 3, 6, 4]]


def _write(
    folder: Path, name: str, start: int, end: int, resumed_from: tuple | None, t: float, **edits
) -> None:
    folder.mkdir(exist_ok=True)
    header = {
        "generation": name,
        "rank": 0,
        "world_size": 1,
        "resumed_from": None
        if resumed_from is None
        else {"generation": resumed_from[0], "step": resumed_from[1]},
        "start_step": start,
        "pid": 1,
        "restart_count": 0,
        "t": t,
    }
    lines = [header]
    for step in range(start, end):
        samples = edits.get("samples", {}).get(step, ORDER[step])
        for i in range(0, len(samples), MICRO):
            lines.append(
                {"step": step, "indices": samples[i : i + MICRO], "lr": 0.1 / (1 + step), "saved": 0, "t": t}
            )
    (folder / f"{name}-rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _judge(tmp_path: Path, final: str, torn_before: tuple = ()):  # type: ignore[no-untyped-def]
    _write(tmp_path / "ref", "ref", 0, STEPS, None, 0.0)
    reference = read_generations(tmp_path / "ref")["ref"]
    return judge(
        read_generations(tmp_path / "soak"),
        reference,
        final,
        STEPS,
        GLOBAL,
        MICRO,
        DATASET,
        list(torn_before),
    )


def test_a_history_with_a_restart_from_the_newest_checkpoint_passes(tmp_path: Path) -> None:
    soak = tmp_path / "soak"
    _write(soak, "a", 0, 3, None, 1.0)  # trained steps 0-2, killed; checkpoint at step 2
    _write(soak, "b", 2, STEPS, ("a", 2), 2.0)
    verdict = _judge(tmp_path, "b")
    assert verdict.ok, verdict.problems
    assert verdict.chain == [("a", 0, 2), ("b", 2, STEPS)]
    assert verdict.restarts[0]["steps_redone"] == 1  # step 2 was trained by a, lost, and redone


def test_a_step_trained_short_is_caught(tmp_path: Path) -> None:
    soak = tmp_path / "soak"
    _write(soak, "a", 0, 2, None, 1.0)
    _write(soak, "b", 2, STEPS, ("a", 2), 2.0, samples={2: [2, 7]})  # resumed mid-step: one micro-batch lost
    problems = _judge(tmp_path, "b").problems
    assert "step 2: 2 samples, the global batch is 4" in problems
    assert "epoch 1: 2 samples never trained" in problems


def test_a_sample_trained_twice_in_an_epoch_is_caught(tmp_path: Path) -> None:
    soak = tmp_path / "soak"
    _write(soak, "a", 0, STEPS, None, 1.0, samples={1: [2, 6, 4, 3]})
    problems = _judge(tmp_path, "a").problems
    assert "epoch 0: samples trained more than once: [3]" in problems


def test_a_resume_that_skips_a_complete_checkpoint_is_caught_unless_it_was_torn(tmp_path: Path) -> None:
    soak = tmp_path / "soak"
    _write(soak, "a", 0, 2, None, 1.0)
    lines = (soak / "a-rank0.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["saved"] = 2  # the checkpoint of step 2 was complete
    (soak / "a-rank0.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    _write(soak, "b", 0, STEPS, None, 2.0)  # started over from step 0
    assert any(
        "resumed at step 0 though the checkpoint of step 2" in p for p in _judge(tmp_path, "b").problems
    )
    assert _judge(tmp_path, "b", torn_before=(1.5,)).ok


def test_a_broken_chain_is_caught(tmp_path: Path) -> None:
    _write(tmp_path / "soak", "b", 2, STEPS, ("lost", 2), 2.0)
    verdict = _judge(tmp_path, "b")
    assert verdict.problems == ["the chain reaches generation lost, which left no records"]


def test_another_learning_rate_is_caught(tmp_path: Path) -> None:
    soak = tmp_path / "soak"
    _write(soak, "a", 0, STEPS, None, 1.0)
    text = (soak / "a-rank0.jsonl").read_text().replace('"lr": 0.05,', '"lr": 0.051,')  # step 1
    (soak / "a-rank0.jsonl").write_text(text)
    assert any(p.startswith("step 1: learning rates") for p in _judge(tmp_path, "a").problems)
