"""Every results file the READMEs cite exists and names its command and commit; the layout lists every room.

A figure in README.md or benchmarks/README.md is only as good as the file behind it: each
``benchmarks/results/...`` path cited there must exist, and the JSON behind it (the file itself,
or for a figure or a report the JSON of the same run: the longest ``results/*.json`` stem its name
starts with) must say which command wrote it and at which commit. Every results JSON, cited or
not, says both. The README's layout lists every room of ``benchmarks/``, and no script is loose
at the package's top.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from _helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
READMES = (ROOT / "README.md", BENCHMARKS / "README.md")
CITED = re.compile(r"benchmarks/results/[\w.\-/<>]*[\w>]")
COMMIT_KEYS = ("commit", "git_commit")
META_KEYS = ("meta", "metadata", "versions")  # where a script's own writer keeps the commit


def cited_paths(text: str) -> list[str]:
    """The concrete ``benchmarks/results/...`` file paths in ``text`` (templates like ``<device>`` skipped).

    Example:
        >>> cited_paths("see `benchmarks/results/chaos.json`, `benchmarks/results/conv-<device>.json`.")
        ['benchmarks/results/chaos.json']
    """
    return sorted({p for p in CITED.findall(text) if "<" not in p and not p.endswith("/")})


def has_commit(record: dict[str, Any]) -> bool:
    """Whether a results JSON names its commit, at the top or in its metadata."""
    if any(record.get(k) for k in COMMIT_KEYS):
        return True
    return any(isinstance(record.get(m), dict) and record[m].get("git_commit") for m in META_KEYS)


def provenance_problems(json_file: Path) -> list[str]:
    """What ``json_file`` lacks of its command and commit (empty when it names both)."""
    record = json.loads(json_file.read_text())
    name = json_file.relative_to(ROOT) if json_file.is_relative_to(ROOT) else json_file.name
    problems = [] if record.get("command") else [f"{name}: no command"]
    return problems + ([] if has_commit(record) else [f"{name}: no commit"])


def run_record(path: Path) -> Path | None:
    """The JSON of the run that wrote ``path``: itself, or the longest JSON stem its name starts with."""
    if path.suffix == ".json":
        return path
    stems = [p for p in RESULTS.glob("*.json") if path.stem.startswith(p.stem)]
    return max(stems, key=lambda p: len(p.stem), default=None)


def citation_problems(text: str) -> list[str]:
    """What is wrong with the results ``text`` cites: missing files, files without command or commit."""
    problems = []
    for cited in cited_paths(text):
        path = ROOT / cited
        if not path.is_file():
            problems.append(f"{cited}: cited but missing")
            continue
        record = run_record(path)
        if record is None:
            problems.append(f"{cited}: no results JSON of the same run")
        else:
            problems += provenance_problems(record)
    return problems


def rooms() -> list[str]:
    """The rooms of ``benchmarks/``: its sub-packages."""
    return sorted(p.parent.name for p in BENCHMARKS.glob("*/__init__.py"))


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_results_file_exists_and_names_its_command_and_commit(readme: Path) -> None:
    text = readme.read_text()
    assert cited_paths(text), f"{readme} cites no results"
    assert citation_problems(text) == []


def test_a_missing_or_unnamed_citation_is_reported(tmp_path: Path) -> None:
    assert citation_problems("`benchmarks/results/no_such_run.json`") == [
        "benchmarks/results/no_such_run.json: cited but missing"
    ]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"rows": []}))
    assert provenance_problems(bare) == ["bare.json: no command", "bare.json: no commit"]


def test_every_results_json_names_its_command_and_commit() -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files
    assert [p for f in files for p in provenance_problems(f)] == []


def test_the_readme_layout_lists_every_room_and_no_script_is_loose() -> None:
    layout = ROOT.joinpath("README.md").read_text().split("## Layout", 1)[1]
    assert {"memory", "speed", "tenants", "elastic", "faults", "accuracy", "zoo", "common"} <= set(rooms())
    assert [room for room in rooms() if f"benchmarks/{room}/" not in layout] == []
    index = BENCHMARKS.joinpath("README.md").read_text()
    assert [room for room in rooms() if f"\n{room}/ " not in index] == []
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == ["__init__.py"]
