"""Every Python example in the README runs, each in its own namespace and scratch folder.

The blocks run one after another in one fresh interpreter (starting Lightning costs several
seconds per interpreter): a block sees none of another's names, so each must import what it uses.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,  # starts a process
    pytest.mark.xdist_group("readme"),  # the README's blocks run once, on one worker
    pytest.mark.timeout(900),  # every block in one interpreter (its own limit: 600 s)
]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)

_RUNNER = """
import json, os, sys, traceback
blocks, out = json.loads(sys.argv[1]), sys.argv[2]
failures = {}
for i, source in enumerate(blocks):
    folder = os.path.join(out, f"block{i}")
    os.makedirs(folder)
    os.chdir(folder)
    try:
        exec(compile(source, f"README block{i}", "exec"), {"__name__": "__main__"})
    except BaseException:
        failures[i] = traceback.format_exc()[-4000:]
with open(os.path.join(out, "failures.json"), "w") as f:
    json.dump(failures, f)
"""


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("readme")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(BLOCKS), str(out)],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and (out / "failures.json").exists(), proc.stderr[-4000:]
    return json.loads((out / "failures.json").read_text())


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


def test_a_failing_block_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    blocks = ["x = 1", "print(x)"]  # the second block does not see the first one's name
    subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(blocks), str(out)], check=True, timeout=60)
    failures = json.loads((out / "failures.json").read_text())
    assert list(failures) == ["1"] and "NameError" in failures["1"]


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(index: int, failures: dict[str, str]) -> None:
    assert str(index) not in failures, failures.get(str(index))
