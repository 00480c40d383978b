"""Shared by the elastic benchmark's parent and workers: its plan constants and the library fingerprint."""

from __future__ import annotations

import hashlib
from pathlib import Path

from lightning_bandlimit.strategies.exact_global_batch import ExactGlobalBatch
from lightning_bandlimit.strategies.scaling import rule_names

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "elastic.json"
TARGET_POINTS = 0.5

# (devices, accumulate_grad_batches) per phase
SCHEDULES: dict[str, list[tuple[int, int]]] = {
    "fixed": [(1, 1)],
    "1-1-1": [(1, 1), (1, 1), (1, 1)],
    "1-2-1": [(1, 1), (2, 1), (1, 1)],
    "1-4x-1": [(1, 1), (2, 2), (1, 1)],
}
# ExactGlobalBatch needs the global batch, so it is not built by name: see exact_rule
EXACT = ExactGlobalBatch.name
ALL_RULES = (*rule_names(), EXACT)
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


def exact_rule(batch: int) -> ExactGlobalBatch:
    """The benchmark's exact rule: the fixed run's global batch (``batch`` x 1 on 1 process), kept
    with micro-batches ``batch`` (1 process: ``batch`` x 1) or ``batch // 2`` (2 processes: x 1)."""
    return ExactGlobalBatch(batch, micro_batches=sorted({max(1, batch // 2), batch}))
