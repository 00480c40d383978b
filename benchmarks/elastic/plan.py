"""Shared by the elastic benchmark's parent and workers: its plan constants and the library fingerprint."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import RESULTS
from lightning_bandlimit.strategies import ExactGlobalBatch, ScalingRule, rule_from_name, rule_names

DEFAULT_OUTPUT = RESULTS / "elastic.json"
TARGET_POINTS = 0.5

# (devices, accumulate_grad_batches) per phase
SCHEDULES: dict[str, list[tuple[int, int]]] = {
    "fixed": [(1, 1)],
    "1-1-1": [(1, 1), (1, 1), (1, 1)],
    "1-2-1": [(1, 1), (2, 1), (1, 1)],
    "1-4x-1": [(1, 1), (2, 2), (1, 1)],
}
EXACT = ExactGlobalBatch.name
ALL_RULES = rule_names()
# what a rule cannot take from the library's defaults, from --batch (by rule name; see benchmark_rule)
RULE_ARGUMENTS: dict[str, Callable[[int], dict[str, Any]]] = {
    # the fixed run's global batch (``batch`` x 1 on 1 process), kept with micro-batches ``batch``
    # (1 process: ``batch`` x 1) or ``batch // 2`` (2 processes: x 1)
    EXACT: lambda batch: {"global_batch": batch, "micro_batches": sorted({max(1, batch // 2), batch})},
}
# SquareRootScaling needs an Adam-family optimizer: the AdamW group runs it against no rescaling
ADAM_RULES = ("none", "sqrt", EXACT)
SGD_RULES = tuple(rule for rule in ALL_RULES if rule != "sqrt")
# a rule that chooses its own accumulation cannot be run with the launch's simulated 4x accumulation
SKIPPED = {(EXACT, "1-4x-1")}
OPTIMIZERS = ("sgd", "adamw")
# the library code a launch runs; the benchmark refuses to mix versions
FINGERPRINTED = ("strategies", "models", "data", "callbacks")


def library_fingerprint(package: Path) -> str:
    """SHA-256 (first 16 hex digits) of the package sources the benchmark exercises."""
    digest = hashlib.sha256()
    for path in sorted(p for folder in FINGERPRINTED for p in (package / folder).rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def benchmark_rule(name: str, batch: int) -> ScalingRule:
    """The rule ``name`` from the library's registry, with :data:`RULE_ARGUMENTS` for ``--batch``."""
    return rule_from_name(name, **RULE_ARGUMENTS.get(name, lambda _: {})(batch))
