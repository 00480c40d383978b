"""The elastic benchmark's parent side: the plan of runs, and launching each phase in a fresh process."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import REPO_ROOT
from benchmarks.elastic.plan import (
    ADAM_RULES,
    EXACT,
    SCHEDULES,
    SGD_RULES,
    SKIPPED,
    benchmark_rule,
    library_fingerprint,
)


def render_data(seed: int, train_size: int, val_size: int, path: Path) -> None:
    """Render the training and validation images of ``seed`` once, for all launches."""
    import torch

    from lightning_bandlimit.data.synthetic import SyntheticImages

    torch.set_num_threads(1)  # tiny FFTs: more threads only contend on a loaded machine

    def stack(size: int, split: str) -> torch.Tensor:
        data = SyntheticImages(size, seed, split, cache=False)
        return torch.stack([data[i][0] for i in range(size)]) if size else torch.empty(0, 3, 32, 32)

    torch.save({"train": stack(train_size, "train"), "val": stack(val_size, "val")}, path)


def snapshot_env(library: Path) -> dict[str, str]:
    """The environment of a process on the library snapshot: ``library`` first on the path, then
    the repository (for ``benchmarks``; its own ``lightning_bandlimit`` comes after the snapshot's)."""
    paths = [str(library), str(REPO_ROOT), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    env.pop("MASTER_PORT", None)
    return env


def render_in_snapshot(seed: int, train_size: int, val_size: int, path: Path, library: Path) -> None:
    """:func:`render_data` in a fresh process on the library snapshot (as the launches see it)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.elastic.elastic",
            "--render",
            json.dumps([seed, train_size, val_size]),
        ]
        + [str(path)],
        check=True,
        cwd=path.parent,
        env=snapshot_env(library),
        timeout=900,
    )


def launch(cfg: dict[str, Any], log: Path, library: Path) -> tuple[dict[str, Any], float]:
    """Run one phase in a fresh process on the library snapshot; return rank 0's record and the wall time."""
    env = snapshot_env(library)
    start = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.elastic.elastic", "--worker", json.dumps(cfg)],
            check=False,
            cwd=log.parent,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=900,
        )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"launch failed (exit {done.returncode}), log {log}:\n{tail}")
    return json.loads(Path(cfg["out"]).read_text()), wall


def phase_ends(total: int, quantum: int) -> tuple[int, int]:
    """The thirds of the budget, rounded to a multiple of the largest global batch."""
    first = max(quantum, round(total / 3 / quantum) * quantum)
    second = max(first + quantum, round(2 * total / 3 / quantum) * quantum)
    if second >= total:
        raise ValueError(f"budget of {total} samples too small for three phases of multiples of {quantum}")
    return first, second


def check_exactly_once(index_files: list[Path], epochs: int, train_size: int) -> bool:
    per_epoch: dict[str, list[int]] = {}
    for path in index_files:
        for epoch, indices in json.loads(path.read_text()).items():
            per_epoch.setdefault(epoch, []).extend(indices)
    expected = list(range(train_size))
    return sorted(per_epoch) == sorted(str(e) for e in range(epochs)) and all(
        sorted(indices) == expected for indices in per_epoch.values()
    )


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.total = args.epochs * args.train_size
        quantum = args.batch * max(d * a for phases in SCHEDULES.values() for d, a in phases)
        self.ends = phase_ends(self.total, quantum)
        self._first: dict[tuple[str, int], dict[str, Any]] = {}
        # A private copy of the package, taken now: the working tree may change under a long run.
        self.snapshot = workdir / "lib"
        shutil.copytree(
            REPO_ROOT / "lightning_bandlimit",
            self.snapshot / "lightning_bandlimit",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        self.library = library_fingerprint(self.snapshot / "lightning_bandlimit")

    def launch(self, cfg: dict[str, Any], log: Path) -> tuple[dict[str, Any], float]:
        record, wall = launch(cfg, log, self.snapshot)
        if record["library"] != self.library:
            raise RuntimeError(
                f"a launch ran other library sources ({record['library_path']}, fingerprint "
                f"{record['library']}) "
                f"than the snapshot ({self.library})"
            )
        return record, wall

    def base_cfg(
        self, optimizer: str, rule: str, seed: int, devices: int, accumulation: int, out: Path
    ) -> dict[str, Any]:
        a = self.args
        return {
            "optimizer": optimizer,
            "rule": rule,
            "seed": seed,
            "devices": devices,
            "accumulation": accumulation,
            "epochs": a.epochs,
            "train_size": a.train_size,
            "val_size": a.val_size,
            "batch": a.batch,
            "width": a.width,
            "lr": a.lr_sgd if optimizer == "sgd" else a.lr_adamw,
            "data": str(self.workdir / f"data-seed{seed}.pt"),
            "out": str(out),
        }

    def first_phase(self, optimizer: str, seed: int) -> dict[str, Any]:
        """Phase 1 (1 process, rule-independent): run once per optimizer and seed."""
        key = (optimizer, seed)
        if key not in self._first:
            folder = self.workdir / f"{optimizer}-seed{seed}-phase1"
            folder.mkdir()
            cfg = self.base_cfg(optimizer, "none", seed, 1, 1, folder / "phase1.json")
            cfg.update(phase_end=self.ends[0], save=str(folder / "phase1.ckpt"))
            record, wall = self.launch(cfg, folder / "phase1.log")
            self._first[key] = {
                "record": {**record, "wall_s": wall},
                "ckpt": cfg["save"],
                "indices": sorted(folder.glob("phase1-indices-rank*.json")),
            }
        return self._first[key]

    def check_exact(self, name: str, layouts: list[dict[str, Any]]) -> None:
        """Every phase of an exact-global-batch run made optimizer steps of the fixed run's global batch."""
        batch = self.args.batch
        whole = self.args.train_size % batch == 0  # else an epoch's last step is short
        for layout in layouts:
            measured = layout["samples_per_step"]
            if layout["global_batch"] != batch or (whole and measured not in (None, batch)):
                raise RuntimeError(f"{name}: the global batch was not kept at {batch}: {layouts}")

    def run(self, optimizer: str, schedule: str, rule: str, seed: int) -> dict[str, Any]:
        folder = self.workdir / f"{optimizer}-{schedule}-{rule}-seed{seed}"
        folder.mkdir()
        phases: list[dict[str, Any]] = []
        index_files: list[Path] = []
        if schedule == "fixed":
            cfg = self.base_cfg(optimizer, rule, seed, 1, 1, folder / "phase1.json")
            cfg["validate"] = True
            record, wall = self.launch(cfg, folder / "phase1.log")
            phases.append({**record, "wall_s": wall})
        else:
            first = self.first_phase(optimizer, seed)
            phases.append({**first["record"], "shared": True})
            index_files += first["indices"]
            resume = first["ckpt"]
            for number, (devices, accumulation) in enumerate(SCHEDULES[schedule][1:], start=2):
                cfg = self.base_cfg(
                    optimizer, rule, seed, devices, accumulation, folder / f"phase{number}.json"
                )
                cfg["resume"] = resume
                if number < len(SCHEDULES[schedule]):
                    cfg.update(phase_end=self.ends[number - 1], save=str(folder / f"phase{number}.ckpt"))
                    resume = cfg["save"]
                else:
                    cfg["validate"] = True
                record, wall = self.launch(cfg, folder / f"phase{number}.log")
                phases.append({**record, "wall_s": wall})
        index_files += sorted(folder.glob("phase*-indices-rank*.json"))
        layouts = phase_layouts(phases)
        if rule == EXACT:
            self.check_exact(folder.name, layouts)
        final = phases[-1]
        if final["samples_seen"] != self.total:
            raise RuntimeError(f"{folder.name}: {final['samples_seen']} samples seen, planned {self.total}")
        exactly_once = check_exactly_once(index_files, self.args.epochs, self.args.train_size)
        if not exactly_once:
            raise RuntimeError(
                f"{folder.name}: the phases did not see each training sample exactly once per epoch"
            )
        return {
            "optimizer": optimizer,
            "schedule": schedule,
            "rule": rule,
            "seed": seed,
            "val_acc": final["val_acc"],
            "val_loss": final["val_loss"],
            "samples_seen": final["samples_seen"],
            "exactly_once": exactly_once,
            "wall_s": sum(p["wall_s"] for p in phases),
            "fit_s": sum(p["fit_s"] for p in phases),
            "rollbacks": sum(len(p["rollbacks"]) for p in phases),
            "layouts": layouts,
            "phases": phases,
        }


def phase_layouts(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: processes x micro-batch x accumulation as recorded, and the samples per optimizer
    step measured from the samples and steps the phase added (``None`` when it rolled back)."""
    layouts, samples, steps = [], 0, 0
    for p in phases:
        added = p["global_step"] - steps
        measured = (p["samples_seen"] - samples) / added if added and not p["rollbacks"] else None
        layouts.append(
            {
                "devices": p["devices"],
                "micro_batch": p["micro_batch"],
                "accumulation": p["accumulation_applied"],
                "global_batch": p["global_batch"],
                "samples_per_step": measured,
            }
        )
        samples, steps = p["samples_seen"], p["global_step"]
    return layouts


def plan(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The (optimizer, schedule, rule) configurations to run for every seed."""
    runs: list[tuple[str, str, str]] = []
    for optimizer in args.optimizers:
        allowed = SGD_RULES if optimizer == "sgd" else ADAM_RULES
        rules = [r for r in args.rules if r in allowed]
        if not rules:
            continue
        runs.append((optimizer, "fixed", "none"))
        if "1-1-1" in args.schedules:  # the restart control: no resize, so no rule applies
            runs.append((optimizer, "1-1-1", "none"))
        runs += [
            (optimizer, s, r) for s in args.schedules if s != "1-1-1" for r in rules if (r, s) not in SKIPPED
        ]
    if any(rule == EXACT for _, _, rule in runs):
        check_exact_plans(args.batch, {d for _, s, r in runs if r == EXACT for d, _ in SCHEDULES[s]})
    return runs


def check_exact_plans(batch: int, world_sizes: set[int]) -> None:
    """Refuse, before any launch, a ``--batch`` whose exact plans do not fit the schedules: the
    shared first phase (1 process, ``batch`` x 1) must be the exact rule's own plan for 1 process."""
    rule = benchmark_rule(EXACT, batch)
    try:
        plans = {w: rule.plan(w) for w in sorted(world_sizes)}
    except ValueError as error:
        raise SystemExit(f"--batch {batch}: {error}") from None
    if (plans[1].micro_batch, plans[1].accumulation) != (batch, 1):
        raise SystemExit(f"--batch {batch}: {rule!r} plans {plans[1]} on 1 process, not the fixed run's")


# Rough per-launch cost on 2 shared cores (the full run of commit f723f4b): start-up and validation,
# then training time per sample, by number of processes.
_LAUNCH_S = {1: 5.5, 2: 6.8}
_SAMPLE_S = {1: 0.29e-3, 2: 1.0e-3}


def estimate_seconds(
    runs: list[tuple[str, str, str]], seeds: int, total: int, ends: tuple[int, int]
) -> float:
    """A rough wall time of the plan: per seed, every launch's start-up plus its samples' training."""
    bounds = (0, *ends, total)

    def launch(devices: int, samples: int) -> float:
        return _LAUNCH_S[devices] + _SAMPLE_S[devices] * samples

    per_seed = sum(launch(1, bounds[1]) for optimizer in {o for o, s, _ in runs if s != "fixed"})
    for _, schedule, _ in runs:
        phases = SCHEDULES[schedule]
        if schedule == "fixed":
            per_seed += launch(1, total)
        else:
            per_seed += sum(launch(d, bounds[i + 1] - bounds[i]) for i, (d, _) in enumerate(phases) if i)
    return seeds * per_seed
