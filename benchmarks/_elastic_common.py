"""Shared by the elastic benchmark's parent and workers: its plan constants and the library fingerprint."""

from __future__ import annotations

import hashlib
from pathlib import Path

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
ALL_RULES = rule_names()
# SquareRootScaling needs an Adam-family optimizer: the AdamW group runs it against no rescaling
ADAM_RULES = ("none", "sqrt")
SGD_RULES = tuple(rule for rule in ALL_RULES if rule != "sqrt")
OPTIMIZERS = ("sgd", "adamw")
# the library code a launch runs; the benchmark refuses to mix versions
FINGERPRINTED = ("strategies", "models", "data", "callbacks")


def library_fingerprint(package: Path) -> str:
    """SHA-256 (first 16 hex digits) of the package sources the benchmark exercises."""
    digest = hashlib.sha256()
    for path in sorted(p for folder in FINGERPRINTED for p in (package / folder).rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
