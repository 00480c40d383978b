"""Overhead of the robustness recipe over a bare torchattacks loop, and the Fourier heat map's cost.

Side by side in one run, on the same model, data and attacks (FGSM and PGD-10, each at eps
0, 2/255 and 8/255, on a few hundred synthetic test images):

1. **Bare loop**: what a user would write: clean accuracy, then for every attack and eps
   ``adv = attack(x, y)`` and the accuracy on ``adv``, batch by batch. Seeded exactly like the
   recipe, so both compute the same accuracies (checked).
2. **Recipe**: :func:`~lightning_bandlimit.recipes.evaluate_robustness` with the heat
   map off: validation, the same attacks, per-sample bookkeeping and norms, torchmetrics, the
   model-level sanity checks (input gradients, large-budget PGD), ``results.json`` /
   ``results.csv`` rewritten after every record, the plot and ``summary.md``.

Repeats are interleaved (order alternating); the medians give the overhead
``recipe / bare - 1`` (target: at most 10 %), in wall time and in process CPU time. As a
cross-check that shared-machine noise cannot swamp, each run's time outside its attack loops
(the recipe: validation, clean pass, sanity checks, files, plot; the bare loop: its clean pass)
is measured too: their difference is the recipe's fixed cost. Then the Fourier heat map
(``fourier_heat_map``, L2 norm 4) is timed separately on ``--heat_map_samples`` images.

Writes ``benchmarks/results/robustness.json``. Run: ``python -m benchmarks.speed.robustness``
(about two minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torchattacks
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.common.provenance import RESULTS, stamp
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recipes.evaluation.evaluate import evaluate_robustness
from lightning_bandlimit.recipes.evaluation.fourier_heatmap import fourier_heat_map
from lightning_bandlimit.recipes.threats import AttackSpec, derive_seed
from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.versions import library_versions

EPS = [0.0, 2 / 255, 8 / 255]
PGD_STEPS = 10


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, DataLoader]:
    """A small CNN trained briefly on the synthetic data, and a loader over test images."""
    torch.manual_seed(0)
    data = SyntheticImageDataModule(
        train_size=args.train_images, test_size=args.samples, batch_size=args.batch
    )
    data.setup("fit")
    model = ImageClassifier(args.backbone, width=args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for images, labels in data.train_dataloader():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
    model.eval()
    test = [data.test_set[i] for i in range(args.samples)]
    images = torch.stack([t[0] for t in test])
    labels = torch.tensor([t[1] for t in test])
    return model, DataLoader(TensorDataset(images, labels), batch_size=args.batch)


def bare_loop(model: torch.nn.Module, loader: DataLoader, seed: int) -> tuple[list[float], float]:
    """The plain torchattacks evaluation; returns the accuracies (clean, then per attack and eps) and
    the seconds spent in the attack loops (everything but the clean pass)."""
    n = len(loader.dataset)
    with torch.no_grad():
        accuracies = [sum(int((model(x).argmax(1) == y).sum()) for x, y in loader) / n]
    started = time.perf_counter()
    for name in ("fgsm", "pgd"):
        for eps in EPS:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(seed, name, eps))
                if name == "fgsm":
                    attack = torchattacks.FGSM(model, eps=eps)
                else:
                    attack = torchattacks.PGD(model, eps=eps, alpha=2.5 * eps / PGD_STEPS, steps=PGD_STEPS)
                correct = 0
                for x, y in loader:
                    adv = attack(x, y)
                    with torch.no_grad():
                        correct += int((model(adv).argmax(1) == y).sum())
            accuracies.append(correct / n)
    return accuracies, time.perf_counter() - started


def recipe(model: torch.nn.Module, loader: DataLoader, seed: int, folder: Path) -> tuple[list[float], float]:
    """The recipe on the same attacks; returns its accuracies and the time inside attack runs."""
    report = evaluate_robustness(
        {"model": model},
        loader,
        [AttackSpec("fgsm", eps=list(EPS)), AttackSpec("pgd", eps=list(EPS), options={"steps": PGD_STEPS})],
        folder,
        seed=seed,
        device="cpu",
        heat_map=False,
        progress=False,
        strict=False,
        overwrite=True,
    )
    records = report.records
    return [records[0].clean_accuracy, *(r.robust_accuracy for r in records)], sum(r.seconds for r in records)


def timed(fn: Any, *args: Any) -> tuple[Any, float, float]:
    """``(result, wall seconds, CPU seconds of this process)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=256, help="test images")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--backbone", default="small_cnn")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--train_images", type=int, default=1024, help="images of the brief training")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (order alternates)")
    parser.add_argument("--heat_map_samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's choice); 1 is steadier on a shared machine",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "robustness.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, loader = build(args)
    bare_s, recipe_s, attack_s, bare_cpu, recipe_cpu, bare_attack_s = [], [], [], [], [], []
    same = True
    with tempfile.TemporaryDirectory() as folder:
        bare_loop(model, loader, args.seed)  # warm-up (allocator, first-call overheads)
        recipe(model, loader, args.seed, Path(folder))
        for repeat in range(args.repeats):
            for which in ("bare", "recipe") if repeat % 2 == 0 else ("recipe", "bare"):
                if which == "bare":
                    (bare_acc, inside), seconds, cpu = timed(bare_loop, model, loader, args.seed)
                    bare_s.append(seconds)
                    bare_attack_s.append(inside)
                    bare_cpu.append(cpu)
                else:
                    (recipe_acc, inside), seconds, cpu = timed(recipe, model, loader, args.seed, Path(folder))
                    recipe_s.append(seconds)
                    recipe_cpu.append(cpu)
                    attack_s.append(inside)
            same = same and bare_acc == recipe_acc
    bare_median, recipe_median = statistics.median(bare_s), statistics.median(recipe_s)
    overhead = recipe_median / bare_median - 1
    cpu_overhead = statistics.median(recipe_cpu) / statistics.median(bare_cpu) - 1
    # Noise-robust cross-check: what each side spends outside its attack loops (the recipe: validation,
    # clean pass, sanity checks, files, plot; the bare loop: its clean pass), measured within each run.
    fixed = [(r - ra) - (b - ba) for r, ra, b, ba in zip(recipe_s, attack_s, bare_s, bare_attack_s)]
    fixed_fraction = statistics.median(fixed) / bare_median
    verdict = "PASS" if overhead <= 0.10 else "MISS"

    images, labels = next(iter(DataLoader(loader.dataset, batch_size=args.heat_map_samples)))
    heat, heat_s, _ = timed(lambda: fourier_heat_map(model, images, labels, eps=4.0, seed=args.seed))
    height, width = images.shape[-2:]
    evaluations = height * (width // 2 + 1) * len(images)  # bins (about H x (W/2 + 1)) x images

    report = {
        "bare_s": bare_s,
        "recipe_s": recipe_s,
        "recipe_attack_runs_s": attack_s,
        "bare_cpu_s": bare_cpu,
        "recipe_cpu_s": recipe_cpu,
        "cpu_overhead_fraction": cpu_overhead,
        "bare_attack_loops_s": bare_attack_s,
        "fixed_overhead_s": fixed,
        "fixed_overhead_fraction": fixed_fraction,
        "bare_median_s": bare_median,
        "recipe_median_s": recipe_median,
        "overhead_fraction": overhead,
        "target": 0.10,
        "verdict": verdict,
        "identical_accuracies": same,
        "accuracies": recipe_acc,
        "heat_map_s": heat_s,
        "heat_map_images": len(images),
        "heat_map_forward_images": evaluations,
        "heat_map_mean_error": float(heat.mean()),
        "attacks": {"fgsm": EPS, f"pgd-{PGD_STEPS}": EPS},
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": library_versions(),
        "threads": torch.get_num_threads(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.output, {**stamp("benchmarks.speed.robustness"), **report})
    print(
        f"{args.samples} images, {args.backbone} width {args.width}, FGSM + PGD-{PGD_STEPS} at eps "
        f"{[round(e, 4) for e in EPS]}, {args.repeats} interleaved repeats, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"bare torchattacks loop  median {bare_median:6.2f} s   {[round(s, 2) for s in bare_s]}")
    print(
        f"evaluate_robustness     median {recipe_median:6.2f} s   {[round(s, 2) for s in recipe_s]}"
        f"  (attack runs {statistics.median(attack_s):.2f} s)"
    )
    print(
        f"{verdict}  overhead {100 * overhead:+.1f} % wall (target <= 10 %), "
        f"{100 * cpu_overhead:+.1f} % process CPU time; identical accuracies: {same}"
    )
    print(
        f"fixed costs outside the attack loops: {statistics.median(fixed):.2f} s = "
        f"{100 * fixed_fraction:.1f} % of "
        f"the bare loop (validation, sanity checks, files, plot)"
    )
    print(
        f"Fourier heat map: {heat_s:.1f} s for {len(images)} images ({evaluations} image evaluations, "
        f"{evaluations / heat_s:.0f} images/s)"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
