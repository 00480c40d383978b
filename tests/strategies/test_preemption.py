"""Preemption: SIGTERM only sets a flag; the ranks' agreement stops them all with status 143."""

import os
import signal

import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_bandlimit.strategies.preemption import EXIT_STATUS, Preemption


def test_sigterm_sets_the_flag_and_stops_nothing_until_the_ranks_agree() -> None:
    asked: list[bool] = []
    preemption = Preemption(agree=lambda local: asked.append(local) or local)
    before = signal.getsignal(signal.SIGTERM)
    preemption.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this (main) thread
        assert preemption.requested
    finally:
        preemption.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(SIGTERMException) as raised:
        preemption.check()
    assert raised.value.code == EXIT_STATUS == 143 and asked == [True]


def test_another_ranks_sigterm_stops_this_one() -> None:
    preemption = Preemption(agree=lambda local: True)  # some other rank received it
    assert not preemption.requested
    with pytest.raises(SIGTERMException):
        preemption.check()
    assert preemption.requested


def test_no_sigterm_anywhere_goes_on() -> None:
    asked: list[bool] = []
    preemption = Preemption(agree=lambda local: asked.append(local) or local)
    preemption.check()
    preemption.check()
    assert asked == [False, False] and not preemption.requested
