"""Where a robustness evaluation keeps its results: written out after every record.

The store accumulates records, worst cases, sanity checks and heat-map entries, and
:meth:`ResultStore.save` rewrites ``results.json`` and ``results.csv`` atomically
(:func:`~lightning_bandlimit.recipes.results.report.write_results`), so a crash mid-run keeps what was
computed, with ``"status": "crashed"`` and why.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_bandlimit.recipes.results.records import RobustnessRecord, WorstCaseRecord
from lightning_bandlimit.recipes.results.report import write_results
from lightning_bandlimit.recipes.results.sanity import SanityCheck
from lightning_bandlimit.utils.versions import library_versions

__all__ = ["ResultStore"]


@dataclass
class ResultStore:
    """The results of one evaluation so far, and the files they are written to.

    Args:
        output_dir: the output folder (must exist before :meth:`save`).
        seed: the evaluation seed.
        n_samples: samples evaluated per model.
        config: the resolved configuration (``results.json``'s ``config``).
        started: when the evaluation started (ISO time, default: now).
        began: its ``time.perf_counter()`` then (``wall_s`` counts from it).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     store = ResultStore(Path(folder), seed=0, n_samples=4, config={})
        ...     store.save()
        ...     sorted(store.paths)
        ['results_csv', 'results_json']
    """

    output_dir: Path
    seed: int
    n_samples: int
    config: dict[str, Any]
    records: list[RobustnessRecord] = field(default_factory=list)
    worst_case: list[WorstCaseRecord] = field(default_factory=list)
    sanity_checks: list[SanityCheck] = field(default_factory=list)
    heat_maps: list[dict[str, Any]] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    status: str = "running"
    error: str | None = None
    started: str = field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))
    versions: dict[str, str] = field(default_factory=library_versions)
    began: float = field(default_factory=time.perf_counter, repr=False)

    def add_record(self, record: RobustnessRecord) -> None:
        """Keep a record and write the results."""
        self.records.append(record)
        self.save()

    def save(self) -> None:
        """Rewrite ``results.json`` and ``results.csv`` (atomically)."""
        state = {
            "status": self.status,
            "error": self.error,
            "started": self.started,
            "wall_s": time.perf_counter() - self.began,
            "seed": self.seed,
            "n_samples": self.n_samples,
            "versions": self.versions,
            "config": self.config,
            "worst_case": self.worst_case,
            "sanity_checks": self.sanity_checks,
            "heat_maps": self.heat_maps,
        }
        self.paths["results_json"], self.paths["results_csv"] = write_results(
            self.output_dir, self.records, state
        )

    def fail(self, error: BaseException) -> None:
        """Record why the run stopped (``crashed`` for an exception, else ``interrupted``) and save."""
        self.status = "crashed" if isinstance(error, Exception) else "interrupted"
        self.error = f"{type(error).__name__}: {error}"
        self.save()

    def complete(self) -> None:
        """Mark the run complete and save."""
        self.status = "complete"
        self.save()
