"""Chaos soak: a real torchrun elastic job on loopback, killed again and again, judged bitwise.

Usage::

    python -m benchmarks.faults.chaos      # 25+ faults, writes benchmarks/results/chaos.json
    python -m benchmarks.faults.chaos --faults 5 --steps 60 --json /tmp/chaos.json      # the CI version
    python -m benchmarks.faults.chaos --kinds worker-stop worker-pause worker-slow --faults 3 --hang-timeout 5

The job (``chaos_worker.py``): float64, ``ExactGlobalBatch`` with one micro-batch size, an
``ElasticCheckpoint`` every ``--every`` steps, a seeded dataset and no other randomness. First
the **uninterrupted run**: two agents started together (``--nnodes=2``), no faults. Then the
**soak**: two agents ``--nnodes=1:2`` on one c10d rendezvous, and a seeded schedule of faults at
random instants (uniform gaps of ``--gap`` seconds, not waiting for the job to recover, so some
land in a restart or rendezvous):

* ``worker-kill``: SIGKILL of one worker (the OOM killer);
* ``agent-kill``: SIGKILL of one agent and its workers (a lost node);
* ``agent-term``: SIGTERM of one agent (a pre-emption notice: the agent stops its workers);
* ``write-kill``: SIGKILL of the worker that writes the checkpoint, while it writes it;
* ``torn``: the newest checkpoint cut to half its size (a full disk or a power cut after an
  unsynced write), then a worker SIGKILLed so the next start must read it;
* ``exit-abort``: one worker is sent SIGTERM (every rank then stops at one step, the checkpoint
  written there, as after a pre-emption notice) and aborts as it exits (SIGABRT after its exit
  handlers, what ``terminate called without an active exception`` does to a process): the
  restart must resume from that step as if it had exited cleanly;
* ``rejoin``: a new agent joins after an agent was lost (every loss is followed by one).

and faults that stop a worker (SIGSTOP) instead, against the strategy's peer health
(``ElasticDDPStrategy(hang_timeout=, slow_factor=, slow_steps=)``, from ``--hang-timeout``,
``--slow-factor``, ``--slow-steps``):

* ``worker-stop``: one worker stopped for good (a hung device, a livelocked host). The other
  rank's watchdog must name it (a ``PeerWatchdog:`` line) within ``hang_timeout + 15`` s and
  exit, the group restart and resume; the stopped process must be gone without the driver's
  help (its agent SIGKILLs it when it stops the group, 30 s after its SIGTERM, which a stopped
  process leaves pending);
* ``worker-pause``: stopped for ``hang_timeout / 3``, then continued: no restart, the pause lost;
* ``worker-long-pause``: stopped for ``hang_timeout + 5`` s, then continued: as ``worker-stop``;
* ``worker-slow``: stopped and continued again and again (stopped ``4 x --step-sleep``, running
  ``0.6 x --step-sleep``, so every forward is hit) for ``max(15, slow_steps)`` s: a straggler
  report naming that rank (``is a straggler``), no restart.

These four only hit two ranks training in one generation (at one rank no peer watches), one at a
time: the driver waits until the fault is over (the restart, and the stopped process gone; the
pause or slow phase ended and ``hang_timeout`` more) before the next one. Their SIGCONTs come
from timers and a thread, never a blocked driver. Each records ``detected_s`` (the fault to the
first ``PeerWatchdog:`` line the driver saw in the agents' logs, polled as they grow),
``restarted``, ``pause_s`` and for ``worker-slow`` ``reported`` / ``reported_s``.

The driver keeps one agent alive (a fault that would take the last one is deferred), records
each fault, and after the last one waits for the job to finish on its own. ``--kinds`` chooses
the kinds (default all); the ``--faults`` planned faults take them in turn (``--faults 5``: the
first five), in a seeded order. The judgement
(``chaos_judge.py``): the surviving history (the chain of checkpoints back from the finished
generation) trained every step on exactly the uninterrupted run's samples and learning rate,
no sample twice and none missed within an epoch, each restart resumed from the newest complete
checkpoint; final weights equal to the uninterrupted run's (see TOLERANCE); no temporary file
left behind, no process of the job left (a stopped one above all) once its agents ended, no
process aborted at exit (``terminate called without an active exception`` in no agent log:
``aborts_at_exit``); every fault of the four above as expected (``fault_problems`` in
``chaos_judge.py``). Per kind, a row: faults, restarts, detection and time lost (the delay of
the job's first completion of each step against its pace before the fault) as medians. The
exit code is 0 only if everything held.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.provenance import REPO_ROOT, RESULTS, stamp
from benchmarks.faults.chaos_judge import (
    HANG_KINDS,
    NO_RESTART_KINDS,
    STRAGGLER_MARK,
    WATCHDOG_MARK,
    Generation,
    LogWatch,
    attribute,
    count_aborts,
    fault_problems,
    fault_table,
    frontier,
    judge,
    pace,
    parse_straggler,
    parse_watchdog,
    read_generations,
)
from lightning_bandlimit.callbacks.checkpoint_io import temporary_writer

WORKER = Path(__file__).resolve().with_name("chaos_worker.py")  # torchrun starts it as a script
KINDS = ("worker-kill", "agent-kill", "agent-term", "write-kill", "torn", "exit-abort", *HANG_KINDS)
#: kinds deferred while only one agent is live (one would take the last agent; the others need a
#: peer to notice)
NEED_TWO = ("agent-kill", "agent-term", *HANG_KINDS)
#: a stopped worker must be named within hang_timeout + this (seconds)
DETECTION_SLACK = 15.0
#: past hang_timeout + DETECTION_SLACK + this, a worker still stopped is killed by the driver
#: (and that is a failure): torchrun's agent waits 30 s after its SIGTERM before its SIGKILL
RESCUE_S = 60.0
#: Final weights: the soak runs some steps on 1 process and some on 2, so a step's gradient is
#: summed in another order than in the uninterrupted (2-process) run: equal to about 1e-16
#: relative per step in float64. Any real difference (one other sample, another LR) is >= 1e-4.
TOLERANCE = 1e-10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # absent, or renamed away between two calls
        return -1.0


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields from the state on (field 3 is index 0), ``None`` if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


class Target:
    """A worker the driver stops and continues. Signals go to that process only: its pid and
    start time are checked first (its pid may be reused once it is gone)."""

    def __init__(self, pid: int) -> None:
        fields = _stat(pid)
        self.pid, self.start = pid, fields[19] if fields else None

    def state(self) -> str | None:
        """Its state (``T``: stopped), ``None`` once gone or reaped."""
        fields = _stat(self.pid)
        return fields[0] if fields and fields[19] == self.start else None

    def gone(self) -> bool:
        return self.state() in (None, "Z", "X")

    def signal(self, sig: int) -> bool:
        if self.gone():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True


class Cycler(threading.Thread):
    """Stops and continues a target again and again (``stop_s`` stopped, ``run_s`` running)
    until ``seconds`` passed or :meth:`halt`; always leaves it continued. ``ended``: when."""

    def __init__(self, target: Target, stop_s: float, run_s: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.target, self.stop_s, self.run_s, self.seconds = target, stop_s, run_s, seconds
        self.cycles = 0
        self.ended: float | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        until = time.monotonic() + self.seconds
        try:
            while time.monotonic() < until and not self._halt.is_set():
                if not self.target.signal(signal.SIGSTOP):
                    break
                self._halt.wait(self.stop_s)
                self.target.signal(signal.SIGCONT)
                self.cycles += 1
                self._halt.wait(self.run_s)
        finally:
            self.target.signal(signal.SIGCONT)
            self.ended = time.time()

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class Soak:
    """The agents of one job and the faults injected into it."""

    def __init__(self, out: Path, cfg: dict[str, Any], nnodes: str, tag: str) -> None:
        self.out, self.cfg, self.nnodes, self.tag = out, cfg, nnodes, tag
        self.rdzv_id = tag
        self.port = _free_port()
        # The rendezvous store lives outside the agents, as a cluster's rendezvous service would:
        # an agent that hosts it takes the rendezvous down with it when it dies.
        self.store = torch.distributed.TCPStore(
            "127.0.0.1", self.port, is_master=True, wait_for_workers=False
        )
        self.agents: dict[str, subprocess.Popen] = {}
        self.stopped: set[str] = set()  # agents the driver killed or terminated itself
        self.relaunches: list[dict[str, Any]] = []  # after an agent failed on its own
        self.torn_at = 0.0
        self.count = 0
        self.faults: list[dict[str, Any]] = []
        self.logs = LogWatch(out)  # the strategy's watchdog and straggler lines, as they appear
        self.targets: list[Target] = []  # every worker the driver stopped
        self.timers: list[threading.Timer] = []  # the SIGCONTs to come
        self.cyclers: list[Cycler] = []
        self.active: Target | None = None  # the worker the last fault stopped
        self.hang_timeout = float(cfg.get("hang_timeout") or 60.0)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tmp").mkdir(exist_ok=True)

    def start_agent(self) -> str:
        name = f"agent{self.count}"
        self.count += 1
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(self.out / "tmp"),  # temporary files where the judge can count them
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # pytorch/pytorch#135712 (REFERENCE §6)
        }
        log = open(self.out / f"{name}.log", "w")  # noqa: SIM115 (the process keeps it)
        self.agents[name] = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("torchrun")),
                f"--nnodes={self.nnodes}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{self.port}",
                f"--rdzv-id={self.rdzv_id}",
                "--rdzv-conf=join_timeout=120,last_call_timeout=1,close_timeout=10,is_host=0,read_timeout=15,"
                "keep_alive_interval=1,keep_alive_max_attempt=3,heartbeat_timeout=3",
                "--max-restarts=1000",
                "--monitor-interval=0.5",
                str(WORKER),
                json.dumps({**self.cfg, "out": str(self.out)}),
            ],
            cwd=self.out,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return name

    def live(self) -> list[str]:
        """Running agents the driver has not stopped (one shutting down after SIGTERM is gone)."""
        return [n for n, p in self.agents.items() if p.poll() is None and n not in self.stopped]

    def running(self) -> list[str]:
        return [n for n, p in self.agents.items() if p.poll() is None]

    def supervise(self) -> None:
        """Relaunch the job's agents under a new rendezvous when one failed on its own, as a
        cluster's job supervisor (a Kubernetes operator, a Slurm requeue) would.

        torchrun's agent itself gives up in some rendezvous races (a peer that dies between a
        round's completion and the rank assignment makes its store read time out), and an agent
        that exits with an error other than a signal closes the rendezvous for every agent
        (``launch_agent`` shuts it down), so the job cannot go on under that rendezvous id. The
        live agents are stopped with SIGTERM (their workers checkpoint), two new ones start
        under a new id, and the job resumes from its checkpoint.
        """
        self.logs.poll()
        if self.done():
            return
        failed = [
            name
            for name, agent in self.agents.items()
            if agent.poll() not in (None, 0) and name not in self.stopped
        ]
        if not failed:
            return
        reasons = {}
        for name in failed:
            self.stopped.add(name)
            log = (self.out / f"{name}.log").read_text(errors="replace").strip().splitlines()
            reasons[name] = next((line for line in reversed(log) if "Error" in line), log[-1] if log else "")[
                -200:
            ]
        for name in self.live():
            self.stopped.add(name)
            os.kill(self.agents[name].pid, signal.SIGTERM)
        for name in self.running():
            try:
                self.agents[name].wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill_agent(name)
        self.rdzv_id = f"{self.tag}-{len(self.relaunches) + 1}"
        started = [self.start_agent(), self.start_agent()]
        self.relaunches.append(
            {"t": time.time(), "failed": reasons, "rdzv_id": self.rdzv_id, "agents": started}
        )
        print(f"supervisor: relaunched under rendezvous {self.rdzv_id} after {reasons}", flush=True)

    def done(self) -> bool:
        return (self.out / "done.json").exists()

    def kill_agent(self, name: str) -> list[int]:
        """SIGKILL an agent and its workers (torchrun starts them in their own session); their pids."""
        workers = self.workers(name)
        os.killpg(self.agents[name].pid, signal.SIGKILL)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        return workers

    def workers(self, agent: str) -> list[int]:
        return [pid for pid in _children(self.agents[agent].pid) if _alive(pid)]

    def live_workers(self) -> list[int]:
        """The workers of the live agents."""
        return [pid for name in self.live() for pid in self.workers(name)]

    def step(self) -> int:
        """The newest step any rank reported (-1 before any)."""
        return max((p["step"] for p in self.progress()), default=-1)

    def progress(self) -> list[dict[str, Any]]:
        found = []
        for path in self.out.glob("progress-rank*.json"):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError):
                pass
        return found

    def wait_training(self, since: dict[str, Any] | None, deadline: float) -> None:
        """Until the job trains again after the fault ``since``: a step by a generation started
        after it (the fault's restart), or any step if the fault missed."""
        while time.monotonic() < deadline and not self.done():
            self.supervise()
            if since is None:
                if self.step() >= 0:
                    return
            elif any(
                p["t"] > since["t"] + 0.5
                and (
                    "missed" in since
                    or since["kind"] in NO_RESTART_KINDS
                    or p["generation"] != since["generation"]
                )
                for p in self.progress()
            ):
                return
            time.sleep(0.2)

    def stop_all(self) -> None:
        """Kill everything: the SIGCONTs to come cancelled, every worker the driver stopped
        SIGKILLed (a stopped process leaves a SIGTERM pending), every agent and its workers."""
        for timer in self.timers:
            timer.cancel()
        for cycler in self.cyclers:
            cycler.halt()
        for target in self.targets:
            target.signal(signal.SIGKILL)
        for name, agent in self.agents.items():  # stopped ones too: one may still shut down
            if agent.poll() is None:
                self.kill_agent(name)
                agent.wait()

    # ------------------------------------------------------------------ stopped workers

    def pair(self) -> list[dict[str, Any]] | None:
        """The progress of two ranks training in one generation now (both reported in the last
        2 s, both workers of live agents), if there are."""
        now = time.time()
        workers = set(self.live_workers())
        by_generation: dict[str, dict[int, dict[str, Any]]] = {}
        for p in self.progress():
            if now - p["t"] < 2.0 and p["pid"] in workers and "rank" in p:
                by_generation.setdefault(p["generation"], {})[p["rank"]] = p
        return next(
            (
                sorted(ranks.values(), key=lambda p: p["rank"])
                for ranks in by_generation.values()
                if len(ranks) >= 2
            ),
            None,
        )

    def wait_pair(self, timeout: float) -> list[dict[str, Any]] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done():
            self.supervise()
            pair = self.pair()
            if pair is not None:
                return pair
            time.sleep(0.2)
        return None

    def _stop_worker(self, kind: str, rng: random.Random, record: dict[str, Any]) -> Target | None:
        """SIGSTOP one of two ranks training together (``worker-slow``: start its cycles), with
        its SIGCONT on a timer for the pauses; fills ``record``."""
        pair = self.wait_pair(timeout=90.0)
        if pair is None:
            record["missed"] = "no two ranks training in one generation"
            return None
        chosen = rng.choice(pair)
        target = Target(chosen["pid"])
        record.update(
            {
                "target": target.pid,
                "target_rank": chosen["rank"],
                "step": max(p["step"] for p in pair),
                "generation": chosen["generation"],
                "hang_timeout": self.hang_timeout,
            }
        )
        self.logs.poll()  # what the logs hold already is not this fault's detection
        if kind == "worker-slow":
            step_sleep = float(self.cfg["step_sleep"])
            # a forward sleeps step_sleep: running for less than that, each forward spans a stop
            stop_s, run_s = max(4 * step_sleep, 0.02), max(0.6 * step_sleep, 0.005)
            seconds = max(15.0, float(self.cfg.get("slow_steps", 20)))
            cycler = Cycler(target, stop_s, run_s, seconds)
            record.update({"slow_s": seconds, "slow_stop_s": stop_s, "slow_run_s": run_s})
            record["t"] = time.time()
            cycler.start()
            self.cyclers.append(cycler)
            self.targets.append(target)
            return target
        record["t"] = time.time()
        if not target.signal(signal.SIGSTOP):
            record["missed"] = "the worker exited"
            return None
        self.targets.append(target)
        pause = {"worker-pause": self.hang_timeout / 3, "worker-long-pause": self.hang_timeout + 5.0}.get(
            kind
        )
        if pause is None:  # worker-stop: never continued
            record["over_t"] = record["t"]
            return target

        def resume() -> None:
            target.signal(signal.SIGCONT)
            record["over_t"] = time.time()

        record["pause_s"] = pause
        timer = threading.Timer(pause, resume)
        timer.daemon = True
        timer.start()
        self.timers.append(timer)
        return target

    def settle(self, fault: dict[str, Any], target: Target, deadline: float) -> None:
        """Until a fault that stopped a worker is over, then its detections from the logs.

        ``worker-stop``, ``worker-long-pause``: the group restarted (a rank of a new generation
        trained) and the stopped worker is gone (``target_gone_s``); still there past
        ``hang_timeout + DETECTION_SLACK + RESCUE_S``, the driver SIGKILLs it (``rescued_s``).
        ``worker-pause``: continued, then ``hang_timeout`` more (a restart it caused would come by
        then). ``worker-slow``: the cycles ended, then 2 s (a report late in the logs).
        """
        kind, t0 = fault["kind"], fault["t"]
        cycler = self.cyclers[-1] if kind == "worker-slow" else None
        while time.monotonic() < deadline and not self.done():
            self.supervise()
            now = time.time()
            if cycler is not None and cycler.ended is not None:
                fault.setdefault("over_t", cycler.ended)
                fault["cycles"] = cycler.cycles
            over = fault.get("over_t")
            if kind in ("worker-stop", "worker-long-pause"):
                if target.gone():
                    fault.setdefault("target_gone_s", now - t0)
                elif now - t0 > self.hang_timeout + DETECTION_SLACK + RESCUE_S and "rescued_s" not in fault:
                    fault["rescued_s"] = now - t0
                    target.signal(signal.SIGKILL)
                restarted = any(
                    p["t"] > t0 and p["generation"] != fault["generation"] for p in self.progress()
                )
                if restarted and target.gone() and over is not None:
                    break
            elif over is not None and now > over + (self.hang_timeout if kind == "worker-pause" else 2.0):
                break
            time.sleep(0.2)
        self.logs.poll()
        until = time.time()
        fault["settled_s"] = until - t0
        watchdog = self.logs.first(WATCHDOG_MARK, t0, until)
        fault["detected_s"] = None if watchdog is None else watchdog["t"] - t0
        if watchdog is not None:
            fault["watchdog"] = parse_watchdog(watchdog["line"])
            fault["watchdog_line"] = watchdog["line"]
        if kind == "worker-slow":
            reports = [
                (e, parse_straggler(e["line"]))
                for e in self.logs.seen
                if STRAGGLER_MARK in e["line"] and t0 <= e["t"] <= until
            ]
            mine = [(e, r) for e, r in reports if r is not None and r["rank"] == fault["target_rank"]]
            fault["reported"] = bool(mine)
            fault["reported_s"] = mine[0][0]["t"] - t0 if mine else None
            fault["straggler"] = mine[0][1] if mine else None
            fault["other_reports"] = [e["line"] for e, r in reports if (e, r) not in mine]

    # ------------------------------------------------------------------ faults

    def inject(self, kind: str, rng: random.Random) -> dict[str, Any]:
        progress = sorted(self.progress(), key=lambda p: p["t"])
        live = self.live()
        record: dict[str, Any] = {
            "kind": kind,
            "t": time.time(),
            "step": max((p["step"] for p in progress), default=-1),
            "generation": progress[-1]["generation"] if progress else None,
            "live_agents": live,
        }
        if kind in HANG_KINDS:  # its own time: the instant the worker was stopped
            self.active = self._stop_worker(kind, rng, record)
            return record
        if kind == "rejoin":
            record["target"] = self.start_agent()
        elif kind in ("agent-kill", "agent-term"):
            name = rng.choice(live)
            record["target"] = name
            self.stopped.add(name)
            if kind == "agent-kill":
                record["workers"] = self.kill_agent(name)
            else:
                os.kill(self.agents[name].pid, signal.SIGTERM)
        elif kind in ("worker-kill", "exit-abort"):
            workers = self.live_workers()
            if not workers:
                record["missed"] = "no worker alive (the group was restarting)"
            else:
                pid = rng.choice(workers)
                if kind == "exit-abort":  # the worker aborts as it exits after the SIGTERM
                    (self.out / f"abort-at-exit-{pid}").write_text("")
                os.kill(pid, signal.SIGKILL if kind == "worker-kill" else signal.SIGTERM)
                record["target"] = pid
        elif kind == "write-kill":
            record.update(self._kill_while_writing())
        elif kind == "torn":
            record.update(self._tear())
        record["t"] = time.time()
        return record

    def _writing(self) -> list[tuple[Path, int]]:
        """``(temporary, writer pid)`` of the checkpoints being written now (a dead writer's
        temporaries are leftovers)."""
        ckpt = self.out / "ckpt"
        writers = [(p, temporary_writer(p)) for p in ckpt.iterdir()] if ckpt.exists() else []
        return [(p, w[2]) for p, w in writers if w is not None and _alive(w[2])]

    def _kill_while_writing(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done():
            writing = self._writing()
            if writing:
                path, writer = writing[0]
                os.kill(writer, signal.SIGKILL)
                try:
                    size = path.stat().st_size
                except OSError:
                    size = None
                return {"target": writer, "file": path.name, "bytes_written": size}
            time.sleep(0.002)
        return {"missed": "no checkpoint write seen"}

    def _tear(self, timeout: float = 30.0) -> dict[str, Any]:
        """Cut the newest checkpoint in half, once one was written since the last tear and the
        version before it is whole (a tear with no whole version left, the first checkpoint's or
        two in a row, would destroy every kept version: a loss no resume can undo)."""
        newest = self.out / "ckpt" / "last.ckpt"
        previous = self.out / "ckpt" / "last.prev.ckpt"
        deadline = time.monotonic() + timeout
        while _mtime(newest) <= self.torn_at or not _whole(previous):
            if time.monotonic() > deadline or self.done():
                return {"missed": "no checkpoint written since the last tear"}
            time.sleep(0.1)
        self.torn_at = time.time()
        try:
            with open(newest, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                f.truncate(size // 2)
        except FileNotFoundError:  # renamed away by a save at this instant: tear the next one
            return self._tear(timeout)
        workers = self.live_workers()
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        return {"target": newest.name, "bytes_kept": size // 2, "of": size, "workers": workers}


def _whole(path: Path) -> bool:
    """A checkpoint with its zip directory (``torch.save``'s format), read cheaply."""
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _wait(soak: Soak, timeout: float, supervise: bool = True) -> bool:
    """Until every agent exited (relaunching after a failed one while the job is not done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervise:
            soak.supervise()
        if not soak.running():
            return True
        time.sleep(0.2)
    return False


#: what torch itself leaves in $TMPDIR: torchrun's log folder per agent, inductor's cache
_TORCH_OWN = ("torchelastic_", "torchinductor_")


def _leftovers(out: Path) -> tuple[list[str], int]:
    """Stray files of the checkpoints (beside them or in $TMPDIR), and torch's own folders."""
    stray = [p.name for p in (out / "ckpt").iterdir() if p.name not in ("last.ckpt", "last.prev.ckpt")]
    tmp = list((out / "tmp").iterdir())
    stray += [f"TMPDIR/{p.name}" for p in tmp if not p.name.startswith(_TORCH_OWN)]
    return stray, sum(p.name.startswith(_TORCH_OWN) for p in tmp)


def _processes_left(folder: Path, targets: list[Target], settle: float = 5.0) -> list[dict[str, Any]]:
    """Processes of a job still there (``folder`` in their command line: its agents and workers,
    or a worker the driver stopped), zombies aside; looked for again for up to ``settle`` s while
    some are (one may be exiting)."""
    deadline = time.monotonic() + settle
    while True:
        found: dict[int, dict[str, Any]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in (os.getpid(), os.getppid()):
                continue
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = _stat(int(entry.name))
            if str(folder) in command and fields is not None and fields[0] not in ("Z", "X"):
                found[int(entry.name)] = {
                    "pid": int(entry.name),
                    "state": fields[0],
                    "command": command[:200],
                }
        for target in targets:
            state = target.state()
            if state not in (None, "Z", "X"):
                found.setdefault(
                    target.pid, {"pid": target.pid, "state": state, "command": "stopped by the driver"}
                )
        if not found or time.monotonic() > deadline:
            return sorted(found.values(), key=lambda p: p["pid"])
        time.sleep(0.5)


def _logs(folder: Path) -> list[str]:
    return [p.read_text(errors="replace") for p in sorted(folder.glob("agent*.log"))]


def run_reference(out: Path, cfg: dict[str, Any], timeout: float) -> Generation:
    soak = Soak(out, cfg, "2", "reference")
    soak.start_agent()
    soak.start_agent()
    try:
        if not _wait(soak, timeout, supervise=False) or not soak.done() or soak.count != 2:
            raise RuntimeError(f"the uninterrupted run did not finish on its own; see {out}/agent*.log")
    finally:
        soak.stop_all()
    generations = read_generations(out / "records")
    if len(generations) != 1:
        raise RuntimeError(f"the uninterrupted run restarted ({len(generations)} generations); see {out}")
    return next(iter(generations.values()))


def run_soak(
    out: Path,
    cfg: dict[str, Any],
    faults: int,
    seed: int,
    gap: tuple[float, float],
    timeout: float,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    """Start two agents, inject ``faults`` planned faults of ``kinds`` (plus a rejoin after each
    agent lost)."""
    rng = random.Random(seed)
    plan = [kinds[i % len(kinds)] for i in range(faults)]
    rng.shuffle(plan)
    soak = Soak(out, cfg, "1:2", "soak")
    soak.start_agent()
    soak.start_agent()
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    processes_left = None
    try:
        while plan or len(soak.live()) < 2:  # every agent lost is followed by a rejoin
            soak.supervise()
            if soak.done() or time.monotonic() > deadline or not soak.live():
                break
            # most faults hit a running job; one in four hits whatever is happening (a restart,
            # a rendezvous) right after the previous fault (those that stop a worker wait for two
            # ranks training)
            phase = "training" if last is None or rng.random() >= 0.25 else "any"
            if phase == "training":
                soak.wait_training(since=last, deadline=deadline)
            time.sleep(rng.uniform(*gap))
            if soak.done():
                break
            live = soak.live()
            if len(live) < 2 and (not plan or rng.random() < 0.5):
                kind = "rejoin"
            else:
                kind = next((k for k in plan if len(live) > 1 or k not in NEED_TWO), "rejoin")
                if kind != "rejoin":
                    plan.remove(kind)
            last = soak.inject(kind, rng)
            last["phase"] = "training" if kind in HANG_KINDS else phase
            soak.faults.append(last)
            if kind in HANG_KINDS and "missed" not in last and soak.active is not None:
                soak.settle(last, soak.active, deadline)
            print(f"fault {len(soak.faults):2d}: {_describe(last)}", flush=True)
        finished = _wait(soak, max(10.0, deadline - time.monotonic()))
        if finished:  # its agents ended on their own: nothing of the job may be left
            processes_left = _processes_left(out, soak.targets)
    finally:
        soak.stop_all()
    exit_codes = {name: agent.returncode for name, agent in soak.agents.items()}
    for fault in soak.faults:  # the worker consumes its flag as it aborts
        if fault["kind"] == "exit-abort" and "missed" not in fault:
            if (out / f"abort-at-exit-{fault['target']}").exists():
                fault["missed"] = "the worker ended before its exit handlers ran (SIGTERM while it started)"
    soak.logs.poll()
    return {
        "faults": soak.faults,
        "relaunches": soak.relaunches,
        "not_injected": plan,
        "finished": finished and soak.done(),
        "exit_codes": exit_codes,
        "processes_left": processes_left,
        "log_lines": soak.logs.seen[:200],
    }


def _describe(fault: dict[str, Any]) -> str:
    line = f"{fault['kind']:17s} at step {fault['step']:4d} {fault.get('missed', '')}"
    if fault["kind"] in HANG_KINDS and "missed" not in fault:
        detected = fault.get("reported_s" if fault["kind"] == "worker-slow" else "detected_s")
        line += f"rank {fault['target_rank']}, " + (
            f"{'reported' if fault['kind'] == 'worker-slow' else 'named'} after {detected:.1f} s"
            if detected is not None
            else "not named"
        )
        line += f", over after {fault['settled_s']:.1f} s"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=25, help="planned faults, rejoins not counted")
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=list(KINDS),
        metavar="KIND",
        help=f"the kinds of planned faults, of {', '.join(KINDS)} (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1000, help="long enough to outlast the faults")
    parser.add_argument("--every", type=int, default=4, help="optimizer steps between checkpoints")
    parser.add_argument("--gap", type=float, nargs=2, default=(0.5, 3.0), help="seconds before a fault")
    parser.add_argument("--step-sleep", type=float, default=0.05, help="each micro-batch's forward")
    parser.add_argument(
        "--ballast-mb", type=float, default=24.0, help="checkpoint size, so writes can be hit"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the runs' folder (default: temporary, removed if all held)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--join-timeout",
        type=float,
        default=20.0,
        help="ElasticDDPStrategy(join_timeout=): a job this small forms in 2 s",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=10.0,
        help="ElasticDDPStrategy(hang_timeout=): a stopped peer is named after this (s)",
    )
    parser.add_argument("--slow-factor", type=float, default=2.0, help="ElasticDDPStrategy(slow_factor=)")
    parser.add_argument("--slow-steps", type=int, default=10, help="ElasticDDPStrategy(slow_steps=)")
    parser.add_argument("--json", type=Path, default=RESULTS / "chaos.json")
    args = parser.parse_args(argv)
    cfg = {
        "steps": args.steps,
        "global_batch": 16,
        "micro_batch": 4,
        "dataset": 192,
        "every": args.every,
        "step_sleep": args.step_sleep,
        "ballast_mb": args.ballast_mb,
        "join_timeout": args.join_timeout,
        "hang_timeout": args.hang_timeout,
        "slow_factor": args.slow_factor,
        "slow_steps": args.slow_steps,
    }
    kinds = tuple(dict.fromkeys(args.kinds))
    keep = args.out is not None
    args.out = args.out or Path(tempfile.mkdtemp(prefix="chaos-"))
    t0 = time.monotonic()
    reference = run_reference(args.out / "reference", cfg, timeout=max(300.0, 0.5 * args.steps))
    reference_wall = time.monotonic() - t0
    soak = run_soak(args.out / "soak", cfg, args.faults, args.seed, tuple(args.gap), args.timeout, kinds)
    soak_wall = time.monotonic() - t0 - reference_wall
    result = evaluate(args.out, cfg, reference, soak, kinds)
    result.update(
        {"seed": args.seed, "reference_wall_s": reference_wall, "soak_wall_s": soak_wall, "config": cfg}
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**stamp("benchmarks.faults.chaos", argv), **result}, indent=1))
    print(report(result))
    if result["ok"] and not keep:
        shutil.rmtree(args.out)
    else:
        print(f"records, checkpoints and agent logs: {args.out}")
    return 0 if result["ok"] else 1


def evaluate(
    out: Path,
    cfg: dict[str, Any],
    reference: Generation,
    soak: dict[str, Any],
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    problems: list[str] = []
    if not soak["finished"]:
        problems.append("the soak did not finish")
    if soak["not_injected"]:
        problems.append(f"the job finished before the planned faults {soak['not_injected']} (raise --steps)")
    generations = read_generations(out / "soak" / "records")
    done = (
        json.loads((out / "soak" / "done.json").read_text())
        if (out / "soak" / "done.json").exists()
        else None
    )
    torn = [f["t"] for f in soak["faults"] if f["kind"] == "torn" and "missed" not in f]
    verdict = None
    if done is not None:
        verdict = judge(
            generations,
            reference,
            done["generation"],
            cfg["steps"],
            cfg["global_batch"],
            cfg["micro_batch"],
            cfg["dataset"],
            torn,
        )
        problems += verdict.problems
    weights = {"max_abs_diff": None, "bitwise_equal": None}
    final = out / "soak" / "final.pt"
    if final.exists():
        a, b = torch.load(final), torch.load(out / "reference" / "final.pt")
        diffs = [float((a[k] - b[k]).abs().max()) for k in b]
        weights = {"max_abs_diff": max(diffs), "bitwise_equal": all(torch.equal(a[k], b[k]) for k in b)}
        if weights["max_abs_diff"] > TOLERANCE:
            problems.append(f"final weights differ by {weights['max_abs_diff']:.3g} (tolerance {TOLERANCE})")
    leftovers, torch_folders = _leftovers(out / "soak")
    if leftovers:
        problems.append(f"temporary or stray files left behind: {leftovers[:10]}")
    left = soak.get("processes_left") or []
    stopped = [p for p in left if p["state"] == "T"]
    if stopped:
        problems.append(f"stopped processes left behind: {stopped}")
    if len(left) > len(stopped):
        problems.append(f"processes left behind after the job's agents ended: {left}")
    aborts = {folder: count_aborts(_logs(out / folder)) for folder in ("reference", "soak")}
    if sum(aborts.values()):
        problems.append(f"processes aborted at exit (terminate called without an active exception): {aborts}")
    restarts = verdict.restarts if verdict else []
    micro_per_step = cfg["global_batch"] // cfg["micro_batch"]
    reference_done = frontier({reference.name: reference}, micro_per_step)
    reference_pace = pace(reference_done, max(reference_done, default=0), window=len(reference_done))
    attribute(
        soak["faults"],
        restarts,
        frontier(generations, micro_per_step),
        cfg["every"],
        problems,
        reference_pace,
    )
    for fault in soak["faults"]:
        problems += fault_problems(fault, cfg["hang_timeout"], DETECTION_SLACK)
    result = {
        "ok": not problems,
        "problems": problems,
        "kinds": list(kinds),
        "faults": soak["faults"],
        "restarts": restarts,
        "surviving_steps": verdict.surviving_steps if verdict else 0,
        "generations": len(generations),
        "weights": weights,
        "leftovers": leftovers,
        "processes_left": soak.get("processes_left"),
        "aborts_at_exit": sum(aborts.values()),
        "aborts_by_run": aborts,
        "torch_tmp_folders": torch_folders,
        "exit_codes": soak["exit_codes"],
        "relaunches": soak["relaunches"],
        "log_lines": soak.get("log_lines", []),
        "reference_step_s": reference_pace,
        "hang_timeout": cfg["hang_timeout"],
        "detection_bound_s": cfg["hang_timeout"] + DETECTION_SLACK,
        "tolerance": TOLERANCE,
    }
    result["table"] = fault_table(result["faults"], [*kinds, "rejoin"])
    return result


def report(result: dict[str, Any]) -> str:
    faults = [f for f in result["faults"] if "missed" not in f]
    lines = list(result["table"])
    w = result["weights"]
    lines.append(
        f"faults injected {len(faults)}, restarts {len(result['restarts'])}, surviving steps "
        f"{result['surviving_steps']}, final weights max |diff| {w['max_abs_diff']} "
        f"(bitwise: {w['bitwise_equal']})"
    )
    left = result["processes_left"]
    lines.append(
        f"aborts at exit {result['aborts_at_exit']}, processes left "
        f"{'not checked (the job did not end)' if left is None else len(left)}, stray files "
        f"{len(result['leftovers'])}; detection bound hang_timeout + {DETECTION_SLACK:g} = "
        f"{result['detection_bound_s']:g} s"
    )
    for relaunch in result["relaunches"]:
        lines.append(
            f"relaunched under a new rendezvous after torchrun's agents failed: {relaunch['failed']}"
        )
    lines.append("PASS" if result["ok"] else "FAIL:\n  " + "\n  ".join(result["problems"][:20]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
