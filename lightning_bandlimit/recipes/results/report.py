"""The robustness recipe's outputs: records, results.json / results.csv, the plot, summary.md.

Every file is written atomically (a temporary file in the same folder, then ``os.replace``), so
a crash or an interrupt never leaves a half-written file, and the recipe rewrites
``results.json`` and ``results.csv`` after every record. Plots use
:class:`matplotlib.figure.Figure` with the Agg canvas, never pyplot's global state.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lightning_bandlimit.recipes.results.records import RobustnessRecord, WorstCaseRecord
from lightning_bandlimit.recipes.results.sanity import SanityCheck
from lightning_bandlimit.recipes.threats.attack_info import THREAT_BAND, THREAT_FULL, THREAT_NOISE
from lightning_bandlimit.utils.files import atomic_write, atomic_write_json
from lightning_bandlimit.utils.tables import markdown_table

__all__ = [
    "BAND_WARNING",
    "format_eps",
    "plot_accuracy_vs_eps",
    "summary_markdown",
    "threat_label",
    "write_results",
]

BAND_WARNING = (
    "Only **full-spectrum** rows (adaptive white-box attacks on the whole input spectrum) measure "
    "robustness. **Band-restricted** rows perturb one frequency band only: a band-limited model "
    "discards the frequencies outside the band it keeps, so it is trivially insensitive to "
    "attacks confined to them; a high accuracy there is filtering, not robustness. Random-noise "
    "rows measure corruption robustness, not adversarial robustness."
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return _jsonable(asdict(value))
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def write_results(
    output_dir: Path,
    records: Sequence[RobustnessRecord],
    extra: Mapping[str, Any],
) -> tuple[Path, Path]:
    """Write ``results.json`` (``extra`` plus the records) and ``results.csv`` (the records).

    Args:
        output_dir: the folder (must exist).
        records: the records so far.
        extra: other top-level entries of ``results.json`` (status, versions, seed, config,
            worst case, sanity checks, ...); dataclasses are converted.

    Returns:
        The two paths.

    Example:
        >>> import json, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     j, c = write_results(Path(folder), [RobustnessRecord.fabricate("m", "pgd", 0.1)], {"seed": 0})
        ...     json.loads(j.read_text())["records"][0]["attack"], c.read_text().splitlines()[0][:11]
        ('pgd', 'model,attac')
    """
    output_dir = Path(output_dir)
    payload = {**_jsonable(dict(extra)), "records": [_jsonable(asdict(r)) for r in records]}
    json_path = atomic_write_json(output_dir / "results.json", payload)
    columns = [f.name for f in fields(RobustnessRecord)]

    def write_csv(stream: io.TextIOBase) -> None:
        writer = csv.DictWriter(stream, fieldnames=columns)
        writer.writeheader()
        for record in records:
            row = asdict(record)
            row["band"] = "" if record.band is None else f"{record.band[0]:g}-{record.band[1]:g}"
            writer.writerow({k: "" if v is None else v for k, v in row.items()})

    csv_path = atomic_write(output_dir / "results.csv", write_csv)
    return json_path, csv_path


def format_eps(eps: float, norm: str | None) -> str:
    """``eps`` for humans: L-inf budgets that are multiples of 1/255 also as a fraction.

    Example:
        >>> format_eps(8 / 255, "Linf"), format_eps(0.5, "L2"), format_eps(0.0, "Linf")
        ('8/255', '0.5', '0')
    """
    if eps == 0:
        return "0"
    if norm == "Linf":
        steps = eps * 255
        if abs(steps - round(steps)) < 1e-6:
            return f"{round(steps)}/255"
    return f"{eps:.4g}"


def _band_text(band: Sequence[float] | None, band_name: str | None, source: str | None = None) -> str:
    if band is None:
        if band_name in ("dropped", "kept"):
            return f"{band_name} by {source}'s input layer" if source else f"{band_name} by the input layer"
        return ""
    span = f"{band[0]:g}-{band[1]:g}"
    return f"{band_name} ({span})" if band_name else span


def threat_label(
    threat: str, band: Sequence[float] | None = None, band_name: str | None = None, source: str | None = None
) -> str:
    """The threat column of the report, in words nobody can misread.

    Example:
        >>> threat_label("full-spectrum white-box")
        'full-spectrum (adaptive white-box)'
        >>> threat_label("band-restricted white-box", [0.5, 1.0], "high")
        'band-restricted (white-box, band high (0.5-1))'
        >>> threat_label("random noise", None, "dropped", "bl")
        "random noise, band-restricted (dropped by bl's input layer)"
    """
    text = _band_text(band, band_name, source)
    if threat == THREAT_FULL:
        return "full-spectrum (adaptive white-box)"
    if threat == THREAT_BAND:
        return f"band-restricted (white-box, band {text})"
    if threat == THREAT_NOISE:
        if band is not None and list(band) == [0.0, 1.0]:
            return "random noise, full spectrum"
        return f"random noise, band-restricted ({text})" if text else "random noise"
    return threat


def summary_markdown(
    records: Sequence[RobustnessRecord],
    worst_case: Sequence[WorstCaseRecord],
    checks: Sequence[SanityCheck],
    *,
    title: str = "Robustness evaluation",
    notes: Sequence[str] = (),
) -> str:
    """The Markdown summary: attack table, worst-case robust accuracy, sanity checks, warning.

    Args:
        records: all records.
        worst_case: per-sample worst cases (full-spectrum first).
        checks: sanity checks.
        title: the heading.
        notes: extra lines under the heading (seed, samples, device, ...).

    Example:
        >>> record = RobustnessRecord.fabricate("m", "pgd", 8 / 255, robust_correct=4)
        >>> text = summary_markdown([record], [], [])
        >>> "| m | pgd | full-spectrum (adaptive white-box) | Linf | 8/255 |" in text
        True
    """
    parts = [f"# {title}", ""]
    parts += [f"{line}  " for line in notes]
    parts += ["", f"> {BAND_WARNING}", "", "## Accuracy under attack", ""]
    ordered = sorted(records, key=lambda r: (r.model, r.threat != THREAT_FULL, r.threat, r.attack, r.eps))
    parts.append(
        markdown_table(
            [
                "model",
                "attack",
                "threat",
                "norm",
                "eps",
                "clean acc",
                "acc under attack",
                "mean L2",
                "mean Linf",
                "n",
                "s",
            ],
            [
                [
                    r.model,
                    r.attack,
                    threat_label(r.threat, r.band, r.band_name, r.band_source),
                    r.norm or "-",
                    format_eps(r.eps, r.norm),
                    f"{r.clean_accuracy:.3f}",
                    f"{r.robust_accuracy:.3f}",
                    f"{r.mean_l2:.3g}",
                    f"{r.mean_linf:.3g}",
                    r.n,
                    f"{r.seconds:.1f}",
                ]
                for r in ordered
            ],
        )
    )
    full = [w for w in worst_case if w.threat == THREAT_FULL]
    band = [w for w in worst_case if w.threat != THREAT_FULL]
    parts += ["", "## Robust accuracy (per-sample worst case over full-spectrum attacks)", ""]
    if full:
        parts.append(
            markdown_table(
                ["model", "norm", "eps", "clean acc", "robust acc", "attacks"],
                [
                    [
                        w.model,
                        w.norm,
                        format_eps(w.eps, w.norm),
                        f"{w.clean_accuracy:.3f}",
                        f"**{w.robust_accuracy:.3f}**",
                        ", ".join(w.attacks),
                    ]
                    for w in full
                ],
            )
        )
    else:
        parts.append("No full-spectrum attack was run: **no robustness claim can be made from this report.**")
    if band:
        parts += ["", "## Band-restricted worst case (NOT a robustness measure, see above)", ""]
        parts.append(
            markdown_table(
                ["model", "norm", "eps", "band", "clean acc", "acc under attack", "attacks"],
                [
                    [
                        w.model,
                        w.norm,
                        format_eps(w.eps, w.norm),
                        _band_text(w.band, w.band_name, w.band_source),
                        f"{w.clean_accuracy:.3f}",
                        f"{w.robust_accuracy:.3f}",
                        ", ".join(w.attacks),
                    ]
                    for w in band
                ],
            )
        )
    parts += ["", "## Sanity checks", ""]
    if checks:
        parts.append(
            markdown_table(
                ["check", "model", "result", "detail"],
                [
                    [
                        c.name,
                        c.model or "all",
                        "skipped" if c.skipped else "PASS" if c.passed else "**FAIL**",
                        c.detail.replace("|", "\\|"),
                    ]
                    for c in checks
                ],
            )
        )
    else:
        parts.append("No sanity check ran.")
    return "\n".join(parts) + "\n"


def plot_accuracy_vs_eps(records: Sequence[RobustnessRecord], path: Path, *, title: str = "") -> Path:
    """Accuracy vs eps: one subplot per attack (and band), one curve per variant; saved atomically.

    A variant with several replicates is drawn as the mean over them with +- one standard
    deviation as error bars.

    Args:
        records: the records to plot.
        path: the PNG to write.
        title: the figure title.

    Returns:
        ``path``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     recs = [RobustnessRecord.fabricate("m", "pgd", eps) for eps in (0.0, 0.5, 1.0)]
        ...     plot_accuracy_vs_eps(recs, Path(folder) / "a.png").stat().st_size > 0
        True
    """
    panels: dict[str, list[RobustnessRecord]] = {}
    for r in sorted(records, key=lambda r: (r.threat != THREAT_FULL, r.threat, r.attack)):
        panels.setdefault(r.attack, []).append(r)
    models = sorted({r.variant for r in records})
    count = max(1, len(panels))
    columns = min(3, count)
    rows = math.ceil(count / columns)
    width, height = 4.2 * columns, 3.4 * rows
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    colours = [f"C{i % 10}" for i in range(len(models))]
    for index, (attack, panel) in enumerate(panels.items()):
        axes = figure.add_subplot(rows, columns, index + 1)
        first = panel[0]
        for model, colour in zip(models, colours):
            by_eps: dict[float, list[float]] = {}
            for r in panel:
                if r.variant == model:
                    by_eps.setdefault(r.eps, []).append(r.robust_accuracy)
            if by_eps:
                eps = sorted(by_eps)
                means = [statistics.fmean(by_eps[e]) for e in eps]
                spread = [statistics.stdev(by_eps[e]) if len(by_eps[e]) > 1 else 0.0 for e in eps]
                replicates = max(len(v) for v in by_eps.values())
                axes.errorbar(
                    eps,
                    means,
                    yerr=spread if replicates > 1 else None,
                    fmt="o-",
                    color=colour,
                    capsize=2,
                    label=model if replicates == 1 else f"{model} (mean +- std, {replicates})",
                )
        axes.set_title(
            f"{attack}\n{threat_label(first.threat, first.band, first.band_name, first.band_source)}",
            fontsize=8,
        )
        axes.set_xlabel(f"eps ({first.norm or 'noise std'})", fontsize=8)
        axes.set_ylabel("accuracy", fontsize=8)
        axes.set_ylim(-0.03, 1.03)
        axes.grid(alpha=0.3)
        axes.tick_params(labelsize=7)
        if index == 0:
            axes.legend(fontsize=7)
    if not panels:
        figure.add_subplot(1, 1, 1).text(0.5, 0.5, "no records", ha="center", va="center")
    if title:
        figure.suptitle(title, fontsize=9)
    # Fixed margins in inches: a layout engine ("constrained", tight_layout) would double the cost.
    figure.subplots_adjust(
        left=0.65 / width,
        right=1 - 0.15 / width,
        bottom=0.5 / height,
        top=1 - (0.95 if title else 0.6) / height,
        wspace=0.3,
        hspace=0.6,
    )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return atomic_write(Path(path), buffer.getvalue())
