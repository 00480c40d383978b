"""A hung peer on this machine is SIGKILLed only when machine, pid and start time all match."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from lightning_bandlimit.health.reap import identity, kill_if_local

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


@pytest.fixture
def sleeper():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_stopped_process_on_this_machine_is_killed(sleeper: subprocess.Popen) -> None:
    published = identity(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)  # a stopped process leaves SIGTERM pending; SIGKILL ends it
    assert kill_if_local(published)
    assert sleeper.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.parametrize("field", [0, 2])  # another machine's boot id; a pid reused since (another start)
def test_a_process_that_is_not_the_one_published_is_left_alone(sleeper: subprocess.Popen, field: int) -> None:
    parts = identity(sleeper.pid).split()
    parts[field] = "0" + parts[field]
    assert not kill_if_local(" ".join(parts))
    assert sleeper.poll() is None


@pytest.mark.parametrize("published", ["", "garbage", "a b", "boot x 12", "boot 1 2 3"])
def test_malformed_or_empty_is_ignored(published: str) -> None:
    assert not kill_if_local(published)


def test_never_itself() -> None:
    assert not kill_if_local(identity())  # the process would end its own watchdog's exit


def test_identity_names_pid_and_start_time() -> None:
    boot, pid, started = identity().split()
    assert int(pid) == os.getpid() and started.isdigit() and len(boot) >= 8
