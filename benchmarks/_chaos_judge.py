"""The chaos soak's judgement, computed from the records its workers leave (``_chaos_worker.py``).

Pure functions over plain data, so the tests can feed them histories with a known flaw.

* :func:`read_generations`: the records folder, one entry per generation (one start of the group).
* :func:`surviving_chain`: follow the checkpoints back from the finished generation; the steps
  each generation contributed to the final weights.
* :func:`judge`: every surviving step against the uninterrupted run's same step (samples, batch
  size, learning rate), each epoch's samples exactly once, and every restart resumed from the
  newest checkpoint that had been completed (or the one before, where that one was torn).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Generation:
    """One start of the whole group: its ranks' headers and what each step trained on."""

    name: str
    start_step: int
    world_size: int
    resumed_from: dict[str, Any] | None
    started: float  # the earliest header time of its ranks
    first_batch: float | None = None  # when its first micro-batch finished
    steps: dict[int, list[int]] = field(default_factory=dict)  # step -> sample indices (all ranks)
    lrs: dict[int, set[float]] = field(default_factory=dict)
    micro_batches: Counter = field(default_factory=Counter)  # step -> micro-batches recorded
    saved: int = 0  # the newest checkpoint step any of its ranks knew to be complete

    def completed(self, micro_per_step: int) -> list[int]:
        """Steps for which every micro-batch of the global batch was recorded."""
        return sorted(s for s, n in self.micro_batches.items() if n == micro_per_step)


def read_generations(folder: Path) -> dict[str, Generation]:
    """Parse ``records/*.jsonl`` (a torn last line, from a kill mid-write, is skipped)."""
    generations: dict[str, Generation] = {}
    for path in sorted(folder.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        try:
            header = json.loads(lines[0])
        except (IndexError, json.JSONDecodeError):
            continue
        gen = generations.get(header["generation"])
        if gen is None:
            gen = generations[header["generation"]] = Generation(
                header["generation"],
                header["start_step"],
                header["world_size"],
                header["resumed_from"],
                header["t"],
            )
        gen.started = min(gen.started, header["t"])
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            step = record["step"]
            gen.steps.setdefault(step, []).extend(record["indices"])
            gen.lrs.setdefault(step, set()).add(record["lr"])
            gen.micro_batches[step] += 1
            gen.saved = max(gen.saved, record.get("saved", 0))
            gen.first_batch = record["t"] if gen.first_batch is None else min(gen.first_batch, record["t"])
    return generations


def surviving_chain(
    generations: dict[str, Generation], final: str, total_steps: int
) -> list[tuple[str, int, int]]:
    """``(generation, first step, end step)`` of each link of the history the final weights hold.

    Raises:
        ValueError: if the chain breaks (a generation resumed from a checkpoint no generation
            wrote, or from another step than it started at) or does not start at step 0.
    """
    chain: list[tuple[str, int, int]] = []
    name, end = final, total_steps
    seen = set()
    while True:
        if name in seen:
            raise ValueError(f"the checkpoint chain loops at generation {name}")
        seen.add(name)
        gen = generations.get(name)
        if gen is None:
            raise ValueError(f"the chain reaches generation {name}, which left no records")
        chain.append((name, gen.start_step, end))
        if gen.resumed_from is None:
            if gen.start_step != 0:
                raise ValueError(f"generation {name} started at step {gen.start_step} without a checkpoint")
            return chain[::-1]
        if gen.resumed_from["step"] != gen.start_step:
            raise ValueError(
                f"generation {name} resumed a checkpoint of step {gen.resumed_from['step']} "
                f"but started at step {gen.start_step}"
            )
        name, end = gen.resumed_from["generation"], gen.start_step


@dataclass
class Verdict:
    """What the soak's judgement found; ``problems`` is empty when everything held."""

    problems: list[str]
    surviving_steps: int
    chain: list[tuple[str, int, int]]
    restarts: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(
    generations: dict[str, Generation],
    reference: Generation,
    final: str,
    total_steps: int,
    global_batch: int,
    micro_batch: int,
    dataset: int,
    torn_before: list[float] = (),  # type: ignore[assignment]
) -> Verdict:
    """Judge a soak's history against the uninterrupted ``reference`` generation.

    Args:
        generations: the soak's generations (:func:`read_generations`).
        reference: the uninterrupted run's only generation.
        final: the generation that finished.
        total_steps: optimizer steps of the run.
        global_batch: samples per optimizer step.
        micro_batch: samples per micro-batch.
        dataset: samples in the training set.
        torn_before: times at which the newest checkpoint was torn on purpose; the next restart
            may fall back one checkpoint further.
    """
    problems: list[str] = []
    try:
        chain = surviving_chain(generations, final, total_steps)
    except ValueError as error:
        return Verdict([str(error)], 0, [], [])
    survived: dict[int, list[int]] = {}
    for name, first, end in chain:
        gen = generations[name]
        for step in range(first, end):
            if step not in gen.steps:
                problems.append(
                    f"step {step}: generation {name} holds it in the chain but has no record of it"
                )
                continue
            indices, expected = sorted(gen.steps[step]), sorted(reference.steps.get(step, []))
            if len(indices) != global_batch:
                problems.append(f"step {step}: {len(indices)} samples, the global batch is {global_batch}")
            if indices != expected:
                problems.append(f"step {step}: other samples than the uninterrupted run's")
            lrs = gen.lrs[step] | reference.lrs.get(step, set())
            if max(lrs) - min(lrs) > 1e-12 * max(abs(x) for x in lrs):
                problems.append(f"step {step}: learning rates {sorted(lrs)} (uninterrupted and soak)")
            survived[step] = indices
    if sorted(survived) != list(range(total_steps)):
        missing = sorted(set(range(total_steps)) - set(survived))
        problems.append(f"steps missing from the surviving history: {missing[:10]}")
    per_epoch = dataset // global_batch
    epochs: dict[int, list[int]] = defaultdict(list)
    for step, indices in survived.items():
        epochs[step // per_epoch].extend(indices)
    for epoch, indices in sorted(epochs.items()):
        counts = Counter(indices)
        twice = sorted(i for i, n in counts.items() if n > 1)
        if twice:
            problems.append(f"epoch {epoch}: samples trained more than once: {twice[:10]}")
        complete = all(s in survived for s in range(epoch * per_epoch, (epoch + 1) * per_epoch))
        if complete and len(counts) != per_epoch * global_batch:
            problems.append(f"epoch {epoch}: {per_epoch * global_batch - len(counts)} samples never trained")
    restarts = _restarts(generations, micro_batch, global_batch, torn_before, problems)
    return Verdict(problems, len(survived), chain, restarts)


def _restarts(
    generations: dict[str, Generation],
    micro_batch: int,
    global_batch: int,
    torn_before: list[float],
    problems: list[str],
) -> list[dict[str, Any]]:
    """Each restart: the step resumed, steps redone, and whether it skipped a completed checkpoint."""
    ordered = sorted(generations.values(), key=lambda g: g.started)
    done = -1  # the highest step completed by any earlier generation
    saved = 0  # the newest checkpoint known complete
    restarts = []
    micro_per_step = global_batch // micro_batch
    for previous, gen in zip(ordered, ordered[1:]):
        completed = previous.completed(micro_per_step)
        done = max([done, *completed])
        saved = max(saved, previous.saved)
        torn = any(previous.started <= t <= gen.started for t in torn_before)
        resumed = gen.start_step
        if resumed < saved and not torn:
            problems.append(
                f"generation {gen.name} resumed at step {resumed} though the checkpoint of step {saved} "
                "was complete"
            )
        restarts.append(
            {
                "generation": gen.name,
                "world_size": gen.world_size,
                "resumed_step": resumed,
                "newest_complete_checkpoint": saved,
                "steps_redone": max(0, done + 1 - resumed),
                "torn_before": torn,
                "started": gen.started,
                "first_batch": gen.first_batch,
            }
        )
    return restarts
