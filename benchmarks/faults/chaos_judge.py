"""The chaos soak's judgement, computed from the records its workers leave (``chaos_worker.py``).

Pure functions over plain data, so the tests can feed them histories with a known flaw.

* :func:`read_generations`: the records folder, one entry per generation (one start of the group).
* :func:`surviving_chain`: follow the checkpoints back from the finished generation; the steps
  each generation contributed to the final weights.
* :func:`judge`: every surviving step against the uninterrupted run's same step (samples, batch
  size, learning rate), each epoch's samples exactly once, and every restart resumed from the
  newest checkpoint that had been completed (or the one before, where that one was torn).
* :func:`frontier` and :func:`time_lost`: when each step was first completed, and how much later
  the job got past a fault than its pace before the fault would have had it.
* :class:`LogWatch`, :func:`parse_watchdog`, :func:`parse_straggler`, :func:`count_aborts`: the
  agents' logs (where the workers' stderr goes), read as they grow: when the strategy named a
  hung peer (``PeerWatchdog:``) or a straggler (``is a straggler``), and how many processes
  aborted at exit.
* :func:`fault_problems` and :func:`fault_table`: each fault against what its kind expects, and
  one row per kind.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
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
    done_at: dict[int, float] = field(default_factory=dict)  # step -> its last micro-batch's time

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
            gen.done_at[step] = max(gen.done_at.get(step, record["t"]), record["t"])
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


# ---------------------------------------------------------------------- faults and their cost

#: the faults that stop a worker (SIGSTOP) rather than kill something
HANG_KINDS = ("worker-stop", "worker-pause", "worker-long-pause", "worker-slow")
#: kinds after which the group must not restart
NO_RESTART_KINDS = ("worker-pause", "worker-slow")
#: what the strategy writes when a peer hangs (``PeerWatchdog``), a straggler (rank zero's info
#: line) and what a process that aborts at exit writes (a thread left joinable)
WATCHDOG_MARK = "PeerWatchdog:"
STRAGGLER_MARK = "is a straggler"
ABORT_MARK = "terminate called without an active exception"

_HUNG = re.compile(
    r"rank (\d+) has (?:not advanced past step (-?\d+)|sent no heartbeat|stopped beating before its "
    r"first step) for ([0-9.]+) s"
)
_NUMBER = r"([0-9][0-9.e+-]*|inf|nan)"
_STRAGGLER = re.compile(
    rf"rank (\d+) is a straggler: {_NUMBER} s a step against a median of {_NUMBER} s \({_NUMBER}x\)"
)


def parse_watchdog(line: str) -> dict[str, Any] | None:
    """The rank, step and silence a ``PeerWatchdog:`` line names (``None`` for other lines; the
    values are ``None`` for a watchdog line in another form).

    Example:
        >>> parse_watchdog("[rank 0] PeerWatchdog: rank 1 has not advanced past step 41 for 10.2 s; exiting")
        {'rank': 1, 'step': 41, 'silent_s': 10.2}
        >>> parse_watchdog("[rank 1] PeerWatchdog: rank 0 has sent no heartbeat for 5.5 s (hang_timeout=5 s)")
        {'rank': 0, 'step': None, 'silent_s': 5.5}
    """
    if WATCHDOG_MARK not in line:
        return None
    found = _HUNG.search(line)
    if found is None:
        return {"rank": None, "step": None, "silent_s": None}
    step = None if found[2] is None else int(found[2])
    return {"rank": int(found[1]), "step": step, "silent_s": float(found[3])}


def parse_straggler(line: str) -> dict[str, Any] | None:
    """The rank and figures of a straggler report (``None`` for other lines).

    Example:
        >>> parse_straggler("ElasticDDPStrategy: rank 1 is a straggler: 0.27 s a step against a "
        ...                 "median of 0.1 s (2.7x) for the last 10 steps (slow_factor=2)")
        {'rank': 1, 'seconds': 0.27, 'median': 0.1, 'ratio': 2.7}
    """
    if STRAGGLER_MARK not in line:
        return None
    found = _STRAGGLER.search(line)
    if found is None:
        return {"rank": None, "seconds": None, "median": None, "ratio": None}
    return {
        "rank": int(found[1]),
        "seconds": float(found[2]),
        "median": float(found[3]),
        "ratio": float(found[4]),
    }


def count_aborts(texts: Iterable[str]) -> int:
    """How many processes aborted at exit (``terminate called without an active exception``)."""
    return sum(text.count(ABORT_MARK) for text in texts)


class LogWatch:
    """The lines holding one of ``marks`` in the ``agent*.log`` files of a folder, each with the
    time it was first seen (read as the logs grow: :meth:`poll` reads only what is new, and keeps
    a line not finished yet for the next poll)."""

    def __init__(self, folder: Path, marks: Sequence[str] = (WATCHDOG_MARK, STRAGGLER_MARK)) -> None:
        self.folder, self.marks = folder, tuple(marks)
        self.seen: list[dict[str, Any]] = []  # {"t", "log", "line"}, in the order seen
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}

    def poll(self, now: float | None = None) -> list[dict[str, Any]]:
        """Read what the logs gained since the last poll; the new lines of interest."""
        now = time.time() if now is None else now
        new = []
        for path in sorted(self.folder.glob("agent*.log")):
            offset = self._offsets.get(path.name, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            self._offsets[path.name] = offset + len(data)
            *lines, rest = (self._partial.pop(path.name, b"") + data).split(b"\n")
            if rest:
                self._partial[path.name] = rest
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                if any(mark in line for mark in self.marks):
                    entry = {"t": now, "log": path.name, "line": line[-500:]}
                    self.seen.append(entry)
                    new.append(entry)
        return new

    def first(self, mark: str, since: float, until: float | None = None) -> dict[str, Any] | None:
        """The first line holding ``mark`` seen at or after ``since`` (and not after ``until``)."""
        return next(
            (
                e
                for e in self.seen
                if mark in e["line"] and e["t"] >= since and (until is None or e["t"] <= until)
            ),
            None,
        )


def frontier(generations: dict[str, Generation], micro_per_step: int) -> dict[int, float]:
    """``step -> time`` each step was first completed (every micro-batch recorded), by any
    generation: the job's progress, which a restart does not move back (the steps it redoes
    were completed before)."""
    first: dict[int, float] = {}
    for gen in generations.values():
        for step in gen.completed(micro_per_step):
            first[step] = min(first.get(step, gen.done_at[step]), gen.done_at[step])
    return first


def pace(first_done: dict[int, float], step: int, window: int = 20) -> float | None:
    """Seconds per step before ``step`` completed: the mean gap between first completions over
    the last ``window`` steps, gaps over 4x their median left out (a restart); ``None`` with
    fewer than 3 gaps."""
    gaps = [
        first_done[s] - first_done[s - 1]
        for s in range(step - window + 1, step + 1)
        if s in first_done and s - 1 in first_done
    ]
    if len(gaps) < 3:
        return None
    typical = median(gaps)
    kept = [g for g in gaps if g <= 4 * typical]
    return sum(kept) / len(kept)


def time_lost(
    first_done: dict[int, float], t0: float, over: float | None = None, fallback: float | None = None
) -> float | None:
    """How much later the job got past a fault at ``t0`` than its pace would have had it.

    From the last step completed before the fault (``s0``) to the first completed after it was
    over (``over``: a pause's end, a restart's first batch; ``t0`` if ``None``), ``s1``: the
    time between their completions less ``s1 - s0`` steps at the pace before the fault
    (:func:`pace`, else ``fallback``). ``None`` if there is no such step or no pace.

    Example:
        >>> done = {s: 0.1 * s for s in range(10)} | {s: 0.1 * s + 2.0 for s in range(10, 20)}
        >>> round(time_lost(done, t0=0.95, over=2.95), 6)  # a 2 s pause during step 10
        2.0
    """
    over = t0 if over is None else max(t0, over)
    before = [s for s, t in first_done.items() if t <= t0]
    if not before:
        return None
    s0 = max(before)
    after = [s for s, t in first_done.items() if s > s0 and t >= over]
    seconds = pace(first_done, s0) or fallback
    if not after or seconds is None:
        return None
    s1 = min(after)
    return first_done[s1] - first_done[s0] - (s1 - s0) * seconds


def attribute(
    faults: list[dict[str, Any]],
    restarts: list[dict[str, Any]],
    first_done: dict[int, float],
    every: int,
    problems: list[str],
    fallback_pace: float | None = None,
) -> None:
    """Per fault (in place): the restarts it caused and what it cost.

    A fault's restarts are the generations started after it and before the next fault
    (``restarts``, ``restarted``); with none, and one started after the next fault, a fault of a
    kind that restarts is "overlapped" (the restart answers both). For the first restart: the
    latency (fault to the first trained micro-batch) and the steps redone; each restart's steps
    redone against the bound: the steps since the newest checkpoint, at most ``every`` (twice
    that after a torn checkpoint). ``time_lost_s`` (:func:`time_lost`): to the first step
    completed after the fault was over (``over_t``: the driver's own end of it) and its last
    restart trained.
    """
    times = [f["t"] for f in faults]
    for i, fault in enumerate(faults):
        if "missed" in fault:
            continue
        t_next = times[i + 1] if i + 1 < len(faults) else float("inf")
        inside = [r for r in restarts if fault["t"] <= r["started"] < t_next]
        fault["restarts"] = len(inside)
        fault["restarted"] = bool(inside)
        if not inside and fault["kind"] not in NO_RESTART_KINDS:
            fault["overlapped"] = any(r["started"] >= fault["t"] for r in restarts)
            if not fault["overlapped"]:
                del fault["overlapped"]
        if inside:
            first = inside[0]
            fault["restart_latency_s"] = (first["first_batch"] or first["started"]) - fault["t"]
            fault["resumed_step"] = first["resumed_step"]
            fault["steps_redone"] = first["steps_redone"]
        for restart in inside:
            bound = every * (2 if restart["torn_before"] else 1)
            if restart["steps_redone"] > bound:
                redone = restart["steps_redone"]
                problems.append(f"{fault['kind']} at step {fault['step']}: {redone} steps redone > {bound}")
        over = fault.get("over_t", fault["t"])
        if inside:
            over = max(over, inside[-1]["first_batch"] or inside[-1]["started"])
        fault["time_lost_s"] = time_lost(first_done, fault["t"], over, fallback_pace)


def fault_problems(fault: dict[str, Any], hang_timeout: float, slack: float = 15.0) -> list[str]:
    """What a fault of the kinds that stop a worker (:data:`HANG_KINDS`) was expected to do and
    did not; nothing for the other kinds (their judgement is the history's and the weights').

    * ``worker-stop``, ``worker-long-pause``: a ``PeerWatchdog`` line naming the stopped rank
      within ``hang_timeout + slack`` seconds, then a restart; the stopped worker gone without
      the driver's help.
    * ``worker-pause`` (shorter than ``hang_timeout``): no watchdog line, no restart.
    * ``worker-slow``: a straggler report naming the slowed rank; no watchdog line, no restart.
    * any of them not injected (no pair of ranks training to stop one of).
    * ``exit-abort`` (aborted at its exit): a restart (its own, or one it shared with the next
      fault); the steps redone are judged with every restart's.
    """
    kind = fault["kind"]
    if kind == "exit-abort" and "missed" not in fault:
        if fault.get("restarted") or fault.get("overlapped"):
            return []
        return [f"exit-abort at step {fault['step']}: the group did not restart after the abort"]
    if kind not in HANG_KINDS:
        return []
    where = f"{kind} at step {fault['step']}"
    if "missed" in fault:
        return [f"{where}: not injected ({fault['missed']})"]
    problems = []
    target = fault.get("target_rank")
    detected = fault.get("detected_s")
    if kind in ("worker-stop", "worker-long-pause"):
        bound = hang_timeout + slack
        named = (fault.get("watchdog") or {}).get("rank")
        if detected is None:
            problems.append(f"{where}: no {WATCHDOG_MARK} line named the stopped rank {target}")
        elif detected > bound:
            problems.append(f"{where}: named after {detected:.1f} s > hang_timeout + {slack:g} = {bound:g} s")
        # rank 0 stopped: its process also runs the workers' store (torchrun not sharing its own),
        # so the watchdog finds the store silent (a line naming no rank)
        if detected is not None and named != target and not (named is None and target == 0):
            problems.append(f"{where}: the watchdog named rank {named}, the stopped one was rank {target}")
        if not fault.get("restarted"):
            problems.append(f"{where}: the group did not restart")
        if fault.get("rescued_s") is not None:
            problems.append(
                f"{where}: the stopped worker was still there {fault['rescued_s']:.0f} s after; "
                "the driver killed it"
            )
        return problems
    if detected is not None:
        problems.append(f"{where}: a {WATCHDOG_MARK} line {detected:.1f} s after: {fault['watchdog']}")
    if fault.get("restarted"):
        problems.append(f"{where}: the group restarted (restarts: {fault.get('restarts')})")
    if kind == "worker-slow":
        named = (fault.get("straggler") or {}).get("rank")
        if not fault.get("reported"):
            problems.append(f"{where}: no straggler report for the slowed rank {target}")
        elif named != target:
            problems.append(f"{where}: the straggler reported was rank {named}, the slowed one rank {target}")
    return problems


def _median(values: list[float]) -> str:
    return f"{median(values):.1f}" if values else "-"


def fault_table(faults: list[dict[str, Any]], kinds: Sequence[str]) -> list[str]:
    """One row per kind: faults injected, missed, overlapped (their restart answered a later
    fault too), restarts, detected (median s from the fault to the watchdog's line; to the
    straggler report for ``worker-slow``), time lost (median s, :func:`time_lost`), restart
    latency (median / max s) and the most steps redone.

    Example:
        >>> rows = fault_table([{"kind": "worker-stop", "t": 0, "step": 3, "detected_s": 10.4,
        ...                      "time_lost_s": 41.0, "restarts": 2, "restart_latency_s": 12.0,
        ...                      "steps_redone": 1}], ["worker-stop"])
        >>> rows[1].split()
        ['worker-stop', '1', '0', '0', '2', '10.4', '41.0', '12.0', '/', '12.0', '1']
    """
    header = (
        f"{'fault':17s} {'injected':>8s} {'missed':>6s} {'overlapped':>10s} {'restarts':>8s} "
        f"{'detected s':>10s} {'lost s':>7s} {'restart s median/max':>21s} {'steps redone max':>16s}"
    )
    rows = [header]
    for kind in kinds:
        hit = [f for f in faults if f["kind"] == kind and "missed" not in f]
        missed = sum(1 for f in faults if f["kind"] == kind and "missed" in f)
        key = "reported_s" if kind == "worker-slow" else "detected_s"
        detected = [f[key] for f in hit if f.get(key) is not None]
        lost = [f["time_lost_s"] for f in hit if f.get("time_lost_s") is not None]
        latency = sorted(f["restart_latency_s"] for f in hit if "restart_latency_s" in f)
        redone = [f["steps_redone"] for f in hit if "steps_redone" in f]
        times = f"{median(latency):.1f} / {latency[-1]:.1f}" if latency else "-"
        rows.append(
            f"{kind:17s} {len(hit):8d} {missed:6d} {sum(1 for f in hit if f.get('overlapped')):10d} "
            f"{sum(f.get('restarts', 0) for f in hit):8d} {_median(detected):>10s} {_median(lost):>7s} "
            f"{times:>21s} {max(redone, default=0):16d}"
        )
    return rows
