"""The pure parts ``ElasticDDPStrategy`` is wired around: its bookkeeping across resizes
(``elastic_progress``), the step's LR factor (``step_lr``), the processes' node and thread counts
(``elastic_processes``); and that the strategy's state is that bookkeeping's."""

from dataclasses import replace

import pytest

from lightning_bandlimit.strategies import ElasticDDPStrategy, LinearScaling, TrainingConfig
from lightning_bandlimit.strategies.elastic_processes import (
    ElasticProcesses,
    cpu_threads_per_process,
    nodes_in_world,
)
from lightning_bandlimit.strategies.elastic_progress import ElasticProgress
from lightning_bandlimit.strategies.elastic_resize import Rewarm
from lightning_bandlimit.strategies.elastic_resume import ResumeState
from lightning_bandlimit.strategies.step_lr import StepLRFactor

LAUNCHED = TrainingConfig(world_size=2, per_device_batch=8, lr=0.1, momentum=0.9)


def test_a_new_run_starts_at_its_launch_and_counts_samples_by_step() -> None:
    progress = ElasticProgress()
    assert not progress.started and progress.at_step_boundary
    progress.begin(LAUNCHED)
    assert progress.started and progress.reference is progress.applied is LAUNCHED
    progress.count(16)
    assert not progress.at_step_boundary
    progress.count(16)
    assert (progress.samples_seen, progress.end_step(), progress.step_samples) == (32, 32, 0)
    assert progress.at_step_boundary and progress.samples_seen == 32


def test_the_checkpoint_entry_round_trips_and_a_resume_takes_it_back() -> None:
    progress = ElasticProgress()
    progress.begin(LAUNCHED)
    progress.count(48)
    progress.rewarm = Rewarm(16, 64, 0.5)
    saved = progress.resume_state(
        2, rule="LinearScaling", sampler={"seed": 0}, guard=None, noise={"trace": 1.0}
    )
    assert saved == ResumeState(
        LAUNCHED, LAUNCHED, 2, 48, "LinearScaling", {"seed": 0}, None, {"trace": 1.0}, Rewarm(16, 64, 0.5)
    )
    resumed = ElasticProgress()
    resumed.resume(ResumeState.from_checkpoint(saved.to_checkpoint(), "last.ckpt"))
    assert (resumed.reference, resumed.applied, resumed.samples_seen, resumed.rewarm) == (
        LAUNCHED,
        LAUNCHED,
        48,
        Rewarm(16, 64, 0.5),
    )
    assert resumed.step_samples == 0 and resumed.resized_from is None


@pytest.mark.parametrize(
    ("world_size", "accumulation", "resize"), [(2, 1, False), (1, 1, True), (2, 2, True), (4, 1, True)]
)
def test_a_resize_is_another_world_size_or_accumulation(
    world_size: int, accumulation: int, resize: bool
) -> None:
    saved = ResumeState(LAUNCHED, LAUNCHED, world_size=2, samples_seen=32)
    progress = ElasticProgress()
    progress.resume(saved)
    launched = replace(LAUNCHED, world_size=world_size, accumulation=accumulation)
    assert progress.is_resize(saved, world_size, launched) is resize
    assert progress.resized_from == (2 if resize else None)
    assert progress.launched_accumulation == (accumulation if resize else None)


def test_a_move_to_a_higher_lr_rewarms_and_the_ramp_ends_when_done() -> None:
    rule = LinearScaling(warmup_steps=2)
    progress = ElasticProgress()
    progress.resume(ResumeState(LAUNCHED, LAUNCHED, world_size=2, samples_seen=100))
    assert progress.is_resize(
        ResumeState(LAUNCHED, LAUNCHED, world_size=2), 4, replace(LAUNCHED, world_size=4)
    )
    target = progress.target(rule, 4, damping=1.0)
    assert target == rule.adjust(LAUNCHED, 4, 1.0, accumulation=1)
    assert progress.move_to(target) == 2 and progress.applied == target
    assert (
        progress.rewarm == Rewarm.after(target, target.lr / LAUNCHED.lr, 100) and progress.rewarm is not None
    )
    assert progress.rewarm_factor() == pytest.approx(LAUNCHED.lr / target.lr)  # the ramp's start
    progress.count(progress.rewarm.length)
    assert progress.rewarm_factor() == 1.0 and progress.rewarm is None  # finished: not saved any more
    progress.move_to(LAUNCHED)  # back down: no ramp
    assert progress.rewarm is None and progress.applied == LAUNCHED


def test_the_step_lr_factor_scales_after_the_closure_and_restores_even_on_error() -> None:
    groups = [{"lr": 0.1}, {"lr": 0.3}]
    asked: list[list[float]] = []

    def step(closure):  # type: ignore[no-untyped-def]
        closure()
        asked.append([g["lr"] for g in groups])
        raise RuntimeError("update failed")

    with pytest.raises(RuntimeError), StepLRFactor(groups, lambda: 2.0) as scaled:
        step(scaled.after(lambda: asked.append([g["lr"] for g in groups])))
    assert asked == [[0.1, 0.3], [0.2, 0.6]] and [g["lr"] for g in groups] == [0.1, 0.3]
    calls: list[int] = []
    with StepLRFactor(groups, lambda: calls.append(1) or 1.0) as scaled:
        scaled.after(lambda: None)()
    assert calls == [1] and [g["lr"] for g in groups] == [0.1, 0.3]


def test_nodes_follow_torchruns_world_size_in_whole_nodes() -> None:
    assert nodes_in_world(8, 4, 1) == 2 and nodes_in_world(4, 4, 2) == 1
    assert (
        nodes_in_world(8, 4, 2) is None
        and nodes_in_world(6, 4, 1) is None
        and nodes_in_world(4, 0, 1) is None
    )


def test_cpu_threads_share_the_cores_between_the_local_processes() -> None:
    assert cpu_threads_per_process(None, cores=16, local_processes=4) == 4
    assert cpu_threads_per_process(None, cores=2, local_processes=4) == 1  # at least one
    assert cpu_threads_per_process(None, cores=8, local_processes=0) == 8
    assert cpu_threads_per_process(3, cores=2, local_processes=4) == 3
    assert cpu_threads_per_process(0, cores=2, local_processes=4) is None  # leave torch alone


def test_the_strategys_state_is_its_bookkeeping() -> None:
    strategy = ElasticDDPStrategy(cpu_threads=0, join_timeout=None)
    assert (strategy.reference, strategy.applied, strategy.samples_seen, strategy.resized_from) == (
        None,
        None,
        0,
        None,
    )
    assert (strategy.cpu_threads, strategy.join_timeout, strategy.sampler, strategy.plan) == (
        0,
        None,
        None,
        None,
    )
    strategy._progress.begin(LAUNCHED)
    strategy._progress.count(8)
    strategy.applied = replace(LAUNCHED, lr=0.05)  # what a rollback does
    assert strategy._progress.applied == replace(LAUNCHED, lr=0.05) and strategy.reference == LAUNCHED
    assert strategy.samples_seen == 8
    # the processes' hooks are not shadowed by the launcher hook's default
    assert ElasticDDPStrategy.before_launcher is ElasticProcesses.before_launcher
