"""Helpers shared by the tests and by the scripts they start in subprocesses (so: no pytest here).

Test files import them as ``from _helpers import ...`` (``tests`` is on pytest's ``pythonpath``);
a script finds this module when its test starts it with :func:`run_ddp_script` or :func:`script_env`.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_bandlimit.microbatch import SplitStep as _SplitStep

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# A quiet trainer: nothing written or printed unless a test asks for it.
QUIET = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}

# AdaptiveBandLimit settings for scripted probes (free memory in thousandths of the device):
# raise on the first check under 20 % free, give back after two checks over 40 %.
SCRIPTED_ADAPTIVE = {
    # rungs by stages: these tests script the ladder over the model's stages (the cost order,
    # the default: tests/callbacks/test_rung_order.py)
    "rung_order": "stages",
    "min_free": 0.2,
    "release_free": 0.4,
    "check_every_n_steps": 1,
    "raise_step": 0.3,
    "lower_step": 0.1,
    "release_checks": 2,
    "cooldown_checks": 1,
}


def cpu_trainer(callbacks: Iterable[pl.Callback] = (), **kwargs: Any) -> pl.Trainer:
    """A CPU trainer without logger, checkpoints, progress bar or model summary; ``kwargs`` override."""
    return pl.Trainer(callbacks=list(callbacks), **{"accelerator": "cpu", **QUIET, **kwargs})


def script_env(**extra: str) -> dict[str, str]:
    """The environment for a script a test starts: the package and this folder importable, unbuffered."""
    paths = [str(ROOT), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1", **extra}


def run_python(
    *args: str, cwd: Path | None = None, expect_ok: bool | None = True, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` (a script, ``-m module`` or ``-c source``) in ``cwd`` with :func:`script_env`.

    Args:
        args: the interpreter's arguments.
        cwd: the working directory.
        expect_ok: assert that it exits 0 (``True``) or not (``False``); ``None``: no check.
        timeout: seconds before it is killed (the test then fails).
        env: extra environment variables.

    Returns:
        The finished process, its stdout and stderr as text.
    """
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=script_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if expect_ok is not None:
        assert (proc.returncode == 0) == expect_ok, proc.stderr[-4000:]
    return proc


def free_port() -> int:
    """A TCP port free on loopback now (for a rendezvous or a store a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_agent(
    out: Path,
    port: int,
    name: str,
    script_args: list[str],
    rdzv_id: str,
    rdzv_conf: str,
    monitor_interval: float = 1,
    **env: str,
) -> subprocess.Popen[bytes]:
    """One torchrun agent (``--nnodes=1:2``, one worker, 3 restarts) on the c10d rendezvous at
    ``127.0.0.1:port``, in its own session, its output in ``<out>/<name>.log``.

    torchrun's store is not shared with the workers (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``):
    with it, an agent that joins later waits forever for the new round's ``MASTER_ADDR`` (rank 0
    reuses its cached store info; torch 2.x).
    """
    torchrun = Path(sys.executable).with_name("torchrun")
    args = [str(torchrun), "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d"]
    args += [f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rdzv_id}", f"--rdzv-conf={rdzv_conf}"]
    args += ["--max-restarts=3", f"--monitor-interval={monitor_interval:g}", *script_args]
    log = open(out / f"{name}.log", "wb")  # noqa: SIM115 (the process keeps it)
    return subprocess.Popen(
        args,
        cwd=out,
        env=script_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run_ddp_script(script: Path, out: Path, ranks: int = 2, **env: str) -> list[dict[str, Any]]:
    """Run a DDP ``script`` in ``out`` (its ``BANDLIMIT_OUT``); each rank's :class:`Report`, by rank."""
    run_python(str(script), cwd=out, BANDLIMIT_OUT=str(out), **env)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def close_process_group_at_exit() -> None:
    """In a script: close the process group before the interpreter exits (one left to the exit
    can abort it, "terminate called without an active exception", seen on a loaded machine)."""
    atexit.register(_destroy_process_group)


class Report(pl.Callback):
    """In a script: writes ``$BANDLIMIT_OUT/rank<r>.json``, what ``collect`` returns when training ends."""

    def __init__(self, collect: Callable[[pl.Trainer, pl.LightningModule], dict[str, Any]]) -> None:
        self.collect = collect
        close_process_group_at_exit()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        out = Path(os.environ["BANDLIMIT_OUT"]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps(self.collect(trainer, pl_module)))


def simulate_device(
    ladder: Any, cotenant: Iterable[int], job: Callable[[Any], float], total: int, start: Any
) -> tuple[list[Any], list[float], list[str]]:
    """Drive ``ladder`` (a ``LadderController``) one check per step on a simulated device:
    free = ``total`` - co-tenant - ``job(setting)`` (the job's memory at the setting it runs
    on, which the ladder also observes). Returns the settings run, the free bytes seen and
    the decisions' reasons, per step."""
    from lightning_bandlimit.memory import MemoryReading

    setting, settings, frees, reasons = start, [], [], []
    for used in cotenant:
        memory = job(setting)
        free = total - used - memory
        settings.append(setting)
        frees.append(free)
        ladder.observe(setting, memory)
        decision = ladder.decide(
            MemoryReading(total=total, free=max(0, int(free)), source="scripted"), setting
        )
        reasons.append(decision.reason)
        setting = decision.setting
    return settings, frees, reasons


class SplitDriver(pl.Callback):
    """Drives a :class:`~lightning_bandlimit.microbatch.SplitStep` as the band-limit callback does;
    records each step's chunks and outputs (``remove=False``: leaves its steps open)."""

    def __init__(self, split: int, remove: bool = True) -> None:
        self.step = _SplitStep(name="Driver")
        self.split, self.remove = split, remove
        self.chunks: list[int] = []
        self.outputs: list[Any] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step.install(trainer, pl_module)
        self.step.split = self.split

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.step.start_step(batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.chunks.append(self.step.chunks)
        self.outputs.append(outputs)
        if self.remove:
            self.step.end_step()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.remove:
            self.step.remove()
