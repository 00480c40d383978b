"""Chaos soak: a real torchrun elastic job on loopback, killed again and again, judged bitwise.

Usage::

    python benchmarks/chaos.py                 # 25+ faults, writes benchmarks/results/chaos.json
    python benchmarks/chaos.py --faults 5 --steps 60 --json /tmp/chaos.json   # the CI version

The job (``_chaos_worker.py``): float64, ``ExactGlobalBatch`` with one micro-batch size, an
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
* ``rejoin``: a new agent joins after an agent was lost (every loss is followed by one).

The driver keeps one agent alive (a fault that would take the last one is deferred), records
each fault, and after the last one waits for the job to finish on its own. The judgement
(``_chaos_judge.py``): the surviving history (the chain of checkpoints back from the finished
generation) trained every step on exactly the uninterrupted run's samples and learning rate,
no sample twice and none missed within an epoch, each restart resumed from the newest complete
checkpoint; final weights equal to the uninterrupted run's (see TOLERANCE); no temporary file
left behind. The exit code is 0 only if everything held.
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
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _chaos_judge import Generation, judge, read_generations  # noqa: E402

from lightning_bandlimit.callbacks.checkpoint_io import temporary_writer  # noqa: E402

WORKER = HERE / "_chaos_worker.py"
KINDS = ("worker-kill", "agent-kill", "agent-term", "write-kill", "torn")
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


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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
        out.mkdir(parents=True, exist_ok=True)
        (out / "tmp").mkdir(exist_ok=True)

    def start_agent(self) -> str:
        name = f"agent{self.count}"
        self.count += 1
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
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
                p["t"] > since["t"] + 0.5 and ("missed" in since or p["generation"] != since["generation"])
                for p in self.progress()
            ):
                return
            time.sleep(0.2)

    def stop_all(self) -> None:
        for name, agent in self.agents.items():  # stopped ones too: one may still shut down
            if agent.poll() is None:
                self.kill_agent(name)
                agent.wait()

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
        elif kind == "worker-kill":
            workers = [pid for name in live for pid in self.workers(name)]
            if not workers:
                record["missed"] = "no worker alive (the group was restarting)"
            else:
                pid = rng.choice(workers)
                os.kill(pid, signal.SIGKILL)
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
        """Cut the newest checkpoint in half, once one was written since the last tear (two
        tears in a row would destroy both kept versions: a loss no resume can undo)."""
        newest = self.out / "ckpt" / "last.ckpt"
        deadline = time.monotonic() + timeout
        while _mtime(newest) <= self.torn_at:
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
        workers = [pid for name in self.live() for pid in self.workers(name)]
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        return {"target": newest.name, "bytes_kept": size // 2, "of": size, "workers": workers}


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
    out: Path, cfg: dict[str, Any], faults: int, seed: int, gap: tuple[float, float], timeout: float
) -> dict[str, Any]:
    """Start two agents, inject ``faults`` planned faults (plus a rejoin after each agent lost)."""
    rng = random.Random(seed)
    plan = [KINDS[i % len(KINDS)] for i in range(faults)]
    rng.shuffle(plan)
    soak = Soak(out, cfg, "1:2", "soak")
    soak.start_agent()
    soak.start_agent()
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    try:
        while plan or len(soak.live()) < 2:  # every agent lost is followed by a rejoin
            soak.supervise()
            if soak.done() or time.monotonic() > deadline or not soak.live():
                break
            # most faults hit a running job; one in four hits whatever is happening (a restart,
            # a rendezvous) right after the previous fault
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
                kind = next(
                    (k for k in plan if len(live) > 1 or k not in ("agent-kill", "agent-term")), "rejoin"
                )
                if kind != "rejoin":
                    plan.remove(kind)
            last = soak.inject(kind, rng)
            last["phase"] = phase
            soak.faults.append(last)
            print(
                f"fault {len(soak.faults):2d}: {kind:11s} at step {last['step']:4d} {last.get('missed', '')}",
                flush=True,
            )
        finished = _wait(soak, max(10.0, deadline - time.monotonic()))
    finally:
        soak.stop_all()
    exit_codes = {name: agent.returncode for name, agent in soak.agents.items()}
    return {
        "faults": soak.faults,
        "relaunches": soak.relaunches,
        "not_injected": plan,
        "finished": finished and soak.done(),
        "exit_codes": exit_codes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=25, help="planned faults, rejoins not counted")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600, help="long enough to outlast the faults")
    parser.add_argument("--every", type=int, default=4, help="optimizer steps between checkpoints")
    parser.add_argument("--gap", type=float, nargs=2, default=(0.5, 3.0), help="seconds before a fault")
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument(
        "--ballast-mb", type=float, default=24.0, help="checkpoint size, so writes can be hit"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the runs' folder (default: temporary, removed if all held)"
    )
    parser.add_argument("--timeout", type=float, default=1500.0)
    parser.add_argument(
        "--join-timeout",
        type=float,
        default=20.0,
        help="ElasticDDPStrategy(join_timeout=): a job this small forms in 2 s",
    )
    parser.add_argument("--json", type=Path, default=HERE / "results" / "chaos.json")
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
    }
    keep = args.out is not None
    args.out = args.out or Path(tempfile.mkdtemp(prefix="chaos-"))
    t0 = time.monotonic()
    reference = run_reference(args.out / "reference", cfg, timeout=300)
    reference_wall = time.monotonic() - t0
    soak = run_soak(args.out / "soak", cfg, args.faults, args.seed, tuple(args.gap), args.timeout)
    soak_wall = time.monotonic() - t0 - reference_wall
    result = evaluate(args.out, cfg, reference, soak)
    result.update(
        {"seed": args.seed, "reference_wall_s": reference_wall, "soak_wall_s": soak_wall, "config": cfg}
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(report(result))
    if result["ok"] and not keep:
        shutil.rmtree(args.out)
    else:
        print(f"records, checkpoints and agent logs: {args.out}")
    return 0 if result["ok"] else 1


def evaluate(out: Path, cfg: dict[str, Any], reference: Generation, soak: dict[str, Any]) -> dict[str, Any]:
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
    restarts = verdict.restarts if verdict else []
    _attribute(soak["faults"], restarts, cfg["every"], problems)
    return {
        "ok": not problems,
        "problems": problems,
        "faults": soak["faults"],
        "restarts": restarts,
        "surviving_steps": verdict.surviving_steps if verdict else 0,
        "generations": len(generations),
        "weights": weights,
        "leftovers": leftovers,
        "torch_tmp_folders": torch_folders,
        "exit_codes": soak["exit_codes"],
        "relaunches": soak["relaunches"],
        "tolerance": TOLERANCE,
    }


def _attribute(
    faults: list[dict[str, Any]], restarts: list[dict[str, Any]], every: int, problems: list[str]
) -> None:
    """The restart each fault caused (the first generation started after it), unless another
    fault came before that restart ("overlapped": the restart answers both); its latency
    (fault to the first trained micro-batch) and the steps it redid, against the bound: the
    steps since the newest checkpoint, at most ``every`` (twice that after a torn checkpoint)."""
    times = [f["t"] for f in faults]
    for i, fault in enumerate(faults):
        if "missed" in fault:
            continue
        after = [r for r in restarts if r["started"] >= fault["t"]]
        if not after:
            continue
        restart = after[0]
        if i + 1 < len(faults) and times[i + 1] < restart["started"]:
            fault["overlapped"] = True
            continue
        fault["restart_latency_s"] = (restart["first_batch"] or restart["started"]) - fault["t"]
        fault["resumed_step"] = restart["resumed_step"]
        fault["steps_redone"] = restart["steps_redone"]
        bound = every * (2 if restart["torn_before"] else 1)
        if restart["steps_redone"] > bound:
            problems.append(
                f"{fault['kind']} at step {fault['step']}: {restart['steps_redone']} steps redone > {bound}"
            )


def report(result: dict[str, Any]) -> str:
    faults = [f for f in result["faults"] if "missed" not in f]
    header = (
        f"{'fault':12s} {'injected':>8s} {'missed':>6s} {'overlapped':>10s} "
        f"{'restart s median/max':>21s} {'steps redone max':>16s}"
    )
    lines = [header]
    for kind in (*KINDS, "rejoin"):
        hit = [f for f in faults if f["kind"] == kind]
        missed = sum(1 for f in result["faults"] if f["kind"] == kind and "missed" in f)
        latency = sorted(f["restart_latency_s"] for f in hit if "restart_latency_s" in f)
        redone = [f["steps_redone"] for f in hit if "steps_redone" in f]
        times = f"{latency[len(latency) // 2]:.1f} / {latency[-1]:.1f}" if latency else "-"
        overlapped = sum(1 for f in hit if f.get("overlapped"))
        lines.append(
            f"{kind:12s} {len(hit):8d} {missed:6d} {overlapped:10d} {times:>21s} {max(redone, default=0):16d}"
        )
    w = result["weights"]
    lines.append(
        f"faults injected {len(faults)}, restarts {len(result['restarts'])}, surviving steps "
        f"{result['surviving_steps']}, final weights max |diff| {w['max_abs_diff']} "
        f"(bitwise: {w['bitwise_equal']})"
    )
    for relaunch in result["relaunches"]:
        lines.append(
            f"relaunched under a new rendezvous after torchrun's agents failed: {relaunch['failed']}"
        )
    lines.append("PASS" if result["ok"] else "FAIL:\n  " + "\n  ".join(result["problems"][:20]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
