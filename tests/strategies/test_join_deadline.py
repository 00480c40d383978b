"""JoinDeadline: a set-up that hangs past its bound ends the process with status 75 and one line."""

import time

from _helpers import run_python

HANG = """
import time
from lightning_bandlimit.strategies.join_deadline import JoinDeadline
with JoinDeadline({seconds}, "the process group"):
    time.sleep(600)  # stands in for init_process_group waiting for a dead peer
print("finished")
"""


def test_a_hang_past_the_deadline_exits_75_with_one_line() -> None:
    started = time.monotonic()
    # the block sleeps 600 s; the start-up alone took 32 s under a loaded suite (so no tight bound)
    proc = run_python("-c", HANG.format(seconds=0.5), expect_ok=False, timeout=300)
    assert proc.returncode == 75 and "finished" not in proc.stdout
    assert "the process group did not form within 0.5 s" in proc.stderr
    assert time.monotonic() - started < 300  # not the 600 s the block would have taken


def test_no_bound_or_an_early_finish_leaves_the_process_alone() -> None:
    fast = HANG.replace("time.sleep(600)", "pass")
    for seconds in ("None", "5.0"):
        proc = run_python("-c", fast.format(seconds=seconds), timeout=60)
        assert "finished" in proc.stdout
