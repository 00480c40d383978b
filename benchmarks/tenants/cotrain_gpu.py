"""Several training jobs on one CUDA device under a real squeeze: cotrain's rows on a GPU, with NVML.

``benchmarks/tenants/cotrain.py`` measures the jobs on CPU, where each job counts the others' resident
sets; this is its GPU twin, where nothing is modelled: each job is a process with its own CUDA
context and caching allocator, the device's free memory is NVML's (``NVMLProbe``), and an
overdraw is a real CUDA out-of-memory error. A ballast (this process: a co-tenant without our
callback) takes the device down to a budget smaller than the sum of the jobs' plain peaks by
``--below`` of one job's step memory; the peaks are what NVML's per-process memory
(``nvmlDeviceGetComputeRunningProcesses``: context, allocator cache and tensors) showed for each
job's solo run, and the step memory is torch's (``max_memory_allocated`` over the step).

Every job is the quickstart model (CIFAR ResNet-18 at ``--width``) on synthetic data with its own
seed. All jobs of a set start together (CUDA context, data); job k waits before its first step
until job k-1 has run ``--stagger-steps`` steps (so that the set overlaps however fast the GPU
is). Rows: **plain** (``nn.Conv2d``, no callback: what users run; a job that runs out of memory
ends, as it would), **independent** (``AdaptiveBandLimit`` on NVML, from compression 0, each on its
own; an overdraw is its out-of-memory retry) and **coordinated** (with ``SharedDevice``).

Columns per job: finished or not (and the error), out-of-memory events, lever changes, steps
checkpointed and compressed, accuracy minus solo (GPU kernels are not deterministic: the plain
row's difference is the noise floor), wall time; per set: NVML's per-process peak of each job
against what the job measured itself (torch's peak: the difference is its context and cache).
Writes ``<output>/<name>.json``.

Run (on a machine with a CUDA GPU): ``python -m benchmarks.tenants.cotrain_gpu`` (an H100:
about 2 minutes a seed). Without CUDA it runs the same flow on CPU with no ballast (a smoke test:
nothing is squeezed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.common.provenance import REPO_ROOT, RESULTS, command, stamp
from benchmarks.common.trainer import QUIET

MIB = 2**20
ROWS = ("plain", "independent", "coordinated")
DWELL_S = 1.0


def _job(spec_path: Path) -> None:
    """One training job (a child process): trains, records each step, writes ``result.json``."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import Callback

    from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
    from lightning_bandlimit.data import SyntheticImageDataModule
    from lightning_bandlimit.memory import HostMemoryProbe, NVMLProbe
    from lightning_bandlimit.models import ImageClassifier
    from lightning_bandlimit.recompute.switch import is_checkpointed

    spec = json.loads(spec_path.read_text())
    out = spec_path.parent
    cuda = torch.cuda.is_available()
    # the jobs of a set share the host's cores: all threads each would oversubscribe them (seen
    # on a 16-core host: two jobs' data warm-up took over 100 s against 2 alone)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec["jobs"]))
    pl.seed_everything(spec["seed"], verbose=False)
    model = ImageClassifier("cifar_resnet18", width=spec["width"], learning_rate=0.1)
    data = SyntheticImageDataModule(
        train_size=spec["train_size"], val_size=spec["val_size"], test_size=0, batch_size=spec["batch_size"]
    )
    probe = NVMLProbe(0) if cuda else HostMemoryProbe()
    band = None
    if spec["row"] != "plain":
        band = AdaptiveBandLimit(
            compression=0.0,
            probe=probe,
            min_free=spec["min_free"],
            release_free=spec["release_free"],
            check_every_n_steps=1,
        )

    class Record(Callback):
        """Warm the data, gate the first step on the previous job, record every step."""

        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []
            self.start_bytes = 0

        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            # first of the callbacks: the ledger does not see this job before its turn
            for dataset in (trainer.datamodule.train_set, trainer.datamodule.val_set):
                for index in range(len(dataset)):
                    dataset[index]
            print(f"cotrain_gpu: data warm at {time.time():.1f}", flush=True)
            gate = spec.get("after")
            while gate is not None:
                try:
                    if json.loads(Path(gate).read_text())["step"] >= spec["stagger_steps"]:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.02)
            print(f"cotrain_gpu: gate passed at {time.time():.1f}", flush=True)

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.started = time.perf_counter()

        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            self.begin = time.perf_counter()
            if cuda:
                torch.cuda.synchronize()
                self.start_bytes = torch.cuda.memory_allocated()

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            setting = band.setting if band is not None else None
            self.rows.append(
                {
                    "step": trainer.global_step,
                    "at": time.time(),
                    "t": time.perf_counter() - self.started,
                    "step_s": time.perf_counter() - self.begin,
                    "rung": setting.rung if setting else 0,
                    # what the step ran with (cotrain's count): a first step profiled on the top
                    # rung has every unit checkpointed while its rung still reads 0
                    "checkpointed_units": sum(is_checkpointed(m) for m in trainer.lightning_module.modules()),
                    "compression": setting.compression if setting else 0.0,
                    "allocated_peak": torch.cuda.max_memory_allocated() if cuda else 0,
                    "allocated_start": self.start_bytes,
                    "reserved": torch.cuda.memory_reserved() if cuda else 0,
                    "free": probe.read().free,
                }
            )
            (out / "progress.json").write_text(json.dumps({"step": trainer.global_step}))

    record = Record()
    callbacks: list[Callback] = [record]
    if band is not None:
        callbacks.append(band)
        if spec["row"] == "coordinated":
            callbacks.append(SharedDevice(spec["ledger"], job=spec["name"], dwell=DWELL_S))
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        max_epochs=spec["epochs"],
        **QUIET,
        default_root_dir=str(out),
        callbacks=callbacks,
    )
    error = None
    try:
        trainer.fit(model, datamodule=data)
    except Exception as err:  # noqa: BLE001 - an overdraw ends a plain job: recorded, not hidden
        error = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
    (out / "progress.json").write_text(json.dumps({"step": 10**9}))  # never hold a gated job
    rows = record.rows
    result = {
        "name": spec["name"],
        "row": spec["row"],
        "pid": os.getpid(),
        "error": error,
        "steps": len(rows),
        "val_accuracy": float(trainer.callback_metrics.get("val/acc", float("nan")))
        if error is None
        else None,
        "wall_s": (rows[-1]["t"] if rows else 0.0),
        "torch_peak": max((r["allocated_peak"] for r in rows), default=0),
        "step_bytes": int(statistics.median(r["allocated_peak"] - r["allocated_start"] for r in rows))
        if rows
        else 0,
        "reserved_peak": max((r["reserved"] for r in rows), default=0),
        "ooms": sum(d["reason"] == "oom" for d in band.decisions) if band is not None else 0,
        "decisions": [d for d in band.decisions if d["reason"] != "hold"] if band is not None else [],
        "holds": getattr(next((c for c in callbacks if isinstance(c, SharedDevice)), None), "holds", []),
        "timeline": rows,
    }
    (out / "result.json").write_text(json.dumps(result, default=str))


class Sampler(threading.Thread):
    """NVML's per-process memory of the device's processes, every 20 ms: each pid's peak."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        super().__init__(daemon=True)
        self.nvml, self.handle = nvml, handle
        self.peaks: dict[int, int] = {}
        self.least_free: int | None = None
        self.error: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            try:
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                    used = p.usedGpuMemory
                    if used is not None:
                        self.peaks[p.pid] = max(self.peaks.get(p.pid, 0), int(used))
                free = int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).free)
                self.least_free = free if self.least_free is None else min(self.least_free, free)
            except Exception as err:  # noqa: BLE001 - a sampler's failure is reported, not raised
                self.error = f"{type(err).__name__}: {err}"
            self._done.wait(0.02)

    def stop(self) -> None:
        self._done.set()
        self.join()


def _run_set(specs: list[dict[str, Any]], sampler_factory: Any, timeout: float) -> tuple[list[dict], Any]:
    procs = []
    previous = None
    for spec in specs:
        out = Path(spec["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "progress.json").unlink(missing_ok=True)
        spec = {**spec, "after": None if previous is None else str(previous / "progress.json")}
        (out / "spec.json").write_text(json.dumps(spec))
        log = open(out / "job.log", "w")  # noqa: SIM115 - closed when the job ends
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.tenants.cotrain_gpu", "--job", str(out / "spec.json")],
                    cwd=REPO_ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
                out,
            )
        )
        previous = out
    sampler = sampler_factory()
    if sampler is not None:
        sampler.start()
    deadline = time.monotonic() + timeout
    results = []
    for proc, log, out in procs:
        try:
            code = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        path = out / "result.json"
        if path.is_file():
            results.append(json.loads(path.read_text()))
        else:
            tail = (out / "job.log").read_text().splitlines()[-15:]
            results.append({"name": out.name, "error": f"exit code {code}", "log_tail": tail})
    if sampler is not None:
        sampler.stop()
    return results, sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--below", type=float, default=0.4, help="budget shortfall, in one job's step memory")
    parser.add_argument(
        "--sizing",
        choices=("nvml", "allocated"),
        default="nvml",
        help="the jobs' peaks the budget is short of: NVML's per-process peak (context, cache and "
        "tensors; an allocator refused memory gives its cache back, so plain jobs may still fit), "
        "or their context plus torch's peak",
    )
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--val-size", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--stagger-steps", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a set may run")
    parser.add_argument("--work", type=Path, default=Path("runs/benchmark-cotrain-gpu"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--name", default="cotrain_gpu")
    args = parser.parse_args()
    if args.job is not None:
        _job(args.job)
        return
    import torch

    from benchmarks.tenants.cotrain import count_changes  # the same count as cotrain's table

    cuda = torch.cuda.is_available()
    nvml = handle = None
    if cuda:
        import pynvml as nvml

        nvml.nvmlInit()
        torch.zeros(1, device="cuda")  # this process's context is in every reading below
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        handle = nvml.nvmlDeviceGetHandleByUUID(
            ("GPU-" + uuid if not uuid.startswith("GPU-") else uuid).encode()
        )

    def sampler() -> Sampler | None:
        return Sampler(nvml, handle) if cuda else None

    common = {k: getattr(args, k) for k in ("width", "epochs", "train_size", "val_size", "batch_size")}
    common["stagger_steps"] = args.stagger_steps
    common["jobs"] = args.jobs
    records: list[dict[str, Any]] = []
    started = time.perf_counter()

    def write() -> None:  # after every set: a run stopped early keeps what it measured
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / f"{args.name}.json").write_text(
            json.dumps(
                {
                    "command": command("benchmarks.tenants.cotrain_gpu", sys.argv[1:]),
                    **stamp(),
                    "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                    "torch": torch.__version__,
                    "timeline_columns": [
                        "t_s",
                        "units",
                        "compression",
                        "free_mib",
                        "allocated_peak_mib",
                        "reserved_mib",
                    ],
                    "minutes": (time.perf_counter() - started) / 60,
                    "records": records,
                },
                indent=1,
                default=str,
            )
        )

    for seed in args.seeds:
        work = args.work / f"seed{seed}"
        seeds = [100 * seed + k for k in range(args.jobs)]
        solo_specs = [
            {**common, "name": f"solo{k}", "row": "plain", "seed": s, "out": str(work / f"solo{k}")}
            for k, s in enumerate(seeds)
        ]
        solos = []
        for spec in solo_specs:  # one at a time: nothing beside it
            (result,), sampled = _run_set([spec], sampler, args.timeout)
            result["nvml_peak"] = sampled.peaks.get(result.get("pid"), 0) if sampled is not None else 0
            solos.append(result)
        if any(s.get("error") for s in solos):
            records.append({"seed": seed, "solo_failed": solos})
            write()
            print(f"seed {seed}: a solo run failed: {[s.get('error') for s in solos]}", flush=True)
            continue
        step = statistics.fmean(s["step_bytes"] for s in solos)
        if args.sizing == "nvml":
            peaks = [s["nvml_peak"] or s["reserved_peak"] for s in solos]
        else:  # what a job cannot do without: its context and libraries, and torch's peak
            peaks = [s["nvml_peak"] - s["reserved_peak"] + s["torch_peak"] for s in solos]
        budget = int(sum(peaks) - args.below * step)
        min_free, release_free = (
            max(int(0.08 * step), MIB),
            max(int(0.5 * step), 2 * MIB),
        )  # CPU smoke: no step bytes
        print(
            f"seed {seed}: solo accuracy {[round(s['val_accuracy'], 3) for s in solos]}, NVML peaks "
            f"{[round(p / MIB) for p in peaks]} MiB (torch {[round(s['torch_peak'] / MIB) for s in solos]}), "
            f"step {step / MIB:.0f} MiB, budget {budget / MIB:.0f} MiB",
            flush=True,
        )
        for row in args.rows:
            ballast = None
            if cuda:
                torch.cuda.empty_cache()
                free = torch.cuda.mem_get_info()[0]
                if free > budget:
                    ballast = torch.empty(free - budget, dtype=torch.uint8, device="cuda")
            specs = [
                {
                    **common,
                    "name": f"job{k}",
                    "row": row,
                    "seed": s,
                    "out": str(work / row / f"job{k}"),
                    "ledger": str(work / row / "ledger"),
                    "min_free": min_free,
                    "release_free": release_free,
                }
                for k, s in enumerate(seeds)
            ]
            begin = time.perf_counter()
            results, sampled = _run_set(specs, sampler, args.timeout)
            wall = time.perf_counter() - begin
            del ballast
            jobs = []
            for r, solo in zip(results, solos):
                acc = r.get("val_accuracy")
                jobs.append(
                    {
                        "error": r.get("error"),
                        "log_tail": r.get("log_tail"),
                        "steps": r.get("steps"),
                        "ooms": r.get("ooms"),
                        "changes": count_changes(SimpleNamespace(timeline=r.get("timeline", []))),
                        "checkpointed_steps": sum(x["checkpointed_units"] > 0 for x in r.get("timeline", [])),
                        "compressed_steps": sum(x["compression"] > 0 for x in r.get("timeline", [])),
                        "accuracy_minus_solo": None if acc is None else acc - solo["val_accuracy"],
                        "wall_s": r.get("wall_s"),
                        "nvml_peak_mib": (sampled.peaks.get(r.get("pid"), 0) / MIB) if sampled else None,
                        "torch_peak_mib": r.get("torch_peak", 0) / MIB,
                        "reserved_peak_mib": r.get("reserved_peak", 0) / MIB,
                        "least_free_mib": min((x["free"] for x in r.get("timeline", [])), default=0) / MIB,
                        "decisions": r.get("decisions"),
                        "holds": r.get("holds"),
                        "timeline": [
                            [
                                round(x["t"], 3),
                                x["checkpointed_units"],
                                x["compression"],
                                round(x["free"] / MIB, 1),
                                round(x["allocated_peak"] / MIB, 1),
                                round(x["reserved"] / MIB, 1),
                            ]
                            for x in r.get("timeline", [])
                        ],
                    }
                )
            record = {
                "seed": seed,
                "row": row,
                "budget_mib": budget / MIB,
                "min_free_mib": min_free / MIB,
                "set_wall_s": wall,
                "device_least_free_mib": (sampled.least_free or 0) / MIB if sampled else None,
                "sampler_error": sampled.error if sampled else None,
                "jobs": jobs,
            }
            records.append(record)
            write()
            print(
                f"seed {seed}, {row:>11}: set {wall:.0f} s, device least free "
                f"{record['device_least_free_mib']} MiB",
                flush=True,
            )
            for j in jobs:
                diff = j["accuracy_minus_solo"]
                print(
                    f"    {'FAILED ' + j['error'] if j['error'] else 'ok'}, ooms {j['ooms']}, "
                    f"changes {j['changes']}, ckpt {j['checkpointed_steps']}, "
                    f"compressed {j['compressed_steps']}, "
                    f"acc-solo {diff if diff is None else round(diff, 3)}, "
                    f"wall {j['wall_s']}, NVML {j['nvml_peak_mib']} / torch {j['torch_peak_mib']:.0f} "
                    f"/ reserved {j['reserved_peak_mib']:.0f} MiB",
                    flush=True,
                )


if __name__ == "__main__":
    main()
