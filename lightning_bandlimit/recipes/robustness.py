"""Robustness recipe: classifiers side by side under a suite of attacks, with sanity checks.

``lightning-bandlimit robustness --config robustness`` (or :func:`evaluate_robustness` from
Python) evaluates one or more classifiers (checkpoints of our
:class:`~lightning_bandlimit.models.ImageClassifier`, re-band-limited as they were trained, or
any ``nn.Module`` mapping ``[0, 1]`` images to logits) on a datamodule's test set under the
attacks of :mod:`~lightning_bandlimit.recipes.threats`, at every budget of each attack's
``eps`` list, and writes::

    <output_dir>/
        results.json        one record per model x attack x eps (x band), worst case, sanity
                            checks, library versions, seed, config; rewritten after every record
        results.csv         the records
        accuracy_vs_eps.png one panel per attack, one curve per model
        heat_map_<model>.png / .npy   Fourier heat maps (Yin et al. 2019)
        summary.md          the tables, the sanity checks, which rows measure robustness

How results are counted:

* **accuracy under attack** (per record): the fraction of samples the model classifies
  correctly on the attack's output. For the minimum-norm ``cw`` attack at budget ``eps``: a
  sample is correct when it is correct on the clean image and the attack found no
  misclassified example within L2 distance ``eps``.
* **robust accuracy** (worst case): for each model, norm and budget, the fraction of samples
  correct on the clean image *and* under **every** full-spectrum white-box attack at that norm
  and budget (RobustBench's per-sample worst case). Band-restricted attacks get their own worst
  case, reported apart and labelled as not measuring robustness: a band-limited model ignores
  frequencies outside its band, so attacks confined to them fail trivially.
* perturbation norms are per-sample L2 and L-inf norms of ``adv - clean``, averaged over all
  samples (unperturbed ones count as 0).

Before any work everything is validated: models in eval mode, one probe batch with images in
``[0, 1]`` and ``(N, classes)`` finite logits (rows that look like probabilities, non-negative
and summing to 1, are rejected: cross-entropy on probabilities weakens gradient attacks), labels
in range, attack names, budgets, bands and options, the output folder. A crash mid-run keeps the
records computed so far (``results.json`` says ``"status": "crashed"`` and why).

Attacks need gradients, which ``torch.inference_mode`` (Lightning's default in
``validate`` / ``test`` / ``predict``) and ``torch.no_grad`` forbid: the evaluation runs under
``torch.inference_mode(False)`` and ``torch.enable_grad()``, on clones of the data, so it works
when called from inside a Lightning hook. Parameters are frozen (``requires_grad=False``) while
it runs and restored afterwards, so no ``.grad`` of the models is touched.

The pieces live in three subpackages: :mod:`~.threats` (the attacks, their specifications and
bands), :mod:`~.evaluation` (validation and resolution before any work in ``plan``, loading, the
samples, attacks in a model's own band, one model under every attack, the worst case and
:func:`evaluate_robustness` in ``evaluate``, the sequence over them) and :mod:`~.results` (the
records, the sanity checks, the results files, the report and the study). This module is the
recipe's command line; :mod:`lightning_bandlimit.recipes` holds its public names.

Determinism: data order, attack random starts and noise draw from seeds derived from ``seed``
(:func:`~lightning_bandlimit.recipes.threats.derive_seed`) on a forked RNG (the caller's
RNG state is left alone), so the same seed gives identical records on CPU; on CUDA up to
non-deterministic kernels unless ``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any, NoReturn

import lightning.pytorch as pl
import torch

from lightning_bandlimit.recipes.evaluation.evaluate import evaluate_robustness, run_plan
from lightning_bandlimit.recipes.evaluation.plan import EvaluationPlan, plan_evaluation
from lightning_bandlimit.recipes.results.sanity import SanityCheckError
from lightning_bandlimit.utils.main_run import main_run_checkpoints

__all__ = ["main"]

PROG = "lightning-bandlimit robustness"

# Errors that mean a bad value on the command line (or in its config), raised before any work.
_INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, KeyError)


def _parser() -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    import lightning_bandlimit.data  # noqa: F401  (so that short class names resolve)

    parser = ArgumentParser(
        prog=PROG,
        description="Evaluate classifiers under a suite of attacks and write a side-by-side report.",
        exit_on_error=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file or a packaged recipe name")
    parser.add_argument(
        "--models",
        type=dict[str, str | list[str]] | None,
        default=None,
        help=(
            "name -> ImageClassifier checkpoint path, e.g. '{mine: runs/x/last.ckpt}', or a list of paths: "
            "that variant's replicates (one per training seed), reported as mean +- std with paired "
            "differences, e.g. '{bl: [a.ckpt, b.ckpt], fs: [c.ckpt, d.ckpt]}'"
        ),
    )
    parser.add_argument(
        "--main_run",
        type=str | None,
        default=None,
        help="a main-job run folder, or 'latest' (the newest runs_dir/main-*): adds its band-limited and "
        "full-spectrum checkpoints",
    )
    parser.add_argument(
        "--runs_dir",
        type=str,
        default="runs",
        help="where --main_run latest looks, and the parent of the default output folder",
    )
    parser.add_argument(
        "--data",
        type=pl.LightningDataModule | None,
        default=None,
        help="the LightningDataModule whose test set is used (class_path; our short names work)",
    )
    parser.add_argument(
        "--output_dir",
        type=str | None,
        default=None,
        help="the output folder (default runs_dir/robustness-<timestamp>)",
    )
    # Every other option, with its type, default and help, from evaluate_robustness's signature.
    parser.add_function_arguments(evaluate_robustness, as_group=False, skip={"models", "data", "output_dir"})
    return parser


def _one_line(error: BaseException) -> str:
    """The error's message on one line; jsonargparse's union report shortened to its reasons."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if any(line.startswith("Does not validate against any of the Union subtypes") for line in lines):
        reasons = [line[2:] for line in lines if line.startswith("- ") and "NoneType" not in line]
        given = [line for line in lines if line.startswith("Given value:") and "Namespace(" not in line]
        key = [lines[0].rstrip(":")] if lines[0].startswith("Parser key") else []
        lines = [": ".join(key + ["; ".join(reasons)])] + given
    text = "; ".join(lines)
    if isinstance(error, KeyError) and text.startswith("'") and text.endswith("'"):
        text = text[1:-1]
    return text or type(error).__name__


def _fail(error: BaseException | str) -> NoReturn:
    message = error if isinstance(error, str) else _one_line(error)
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _sources(init: Any) -> dict[str, Any]:
    sources: dict[str, Any] = dict(init.models or {})
    if init.main_run:
        for name, path in main_run_checkpoints(init.main_run, init.runs_dir).items():
            if name in sources:
                raise ValueError(f"model name {name!r} is given by --models and by --main_run; rename one")
            sources[name] = path
    if not sources:
        raise ValueError(
            "expected models to evaluate: pass --models '{name: checkpoint}' and/or --main_run PATH|latest"
        )
    return sources


def _plan(args: list[str]) -> tuple[EvaluationPlan, bool]:
    """Parse the command line and check everything; (the plan, whether ``--strict``)."""
    from lightning_bandlimit.utils.recipe_files import resolve_config_args

    parser = _parser()
    config = parser.parse_args(resolve_config_args(args))
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    init = instantiate(config)
    sources = _sources(init)
    if init.data is None:
        raise ValueError("expected a datamodule: pass --data CLASS (e.g. SyntheticImageDataModule)")
    if not init.attacks:
        raise ValueError("expected attacks: pass --attacks '[{name: pgd, eps: [0, 8/255]}]' or a --config")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    output_dir = Path(init.output_dir) if init.output_dir else Path(init.runs_dir) / f"robustness-{stamp}"
    with torch.inference_mode(False), torch.enable_grad():
        plan = plan_evaluation(
            sources,
            init.data,
            init.attacks,
            output_dir,
            limit=init.limit,
            seed=init.seed,
            device=init.device,
            heat_map=init.heat_map,
            heat_map_eps=init.heat_map_eps,
            heat_map_limit=init.heat_map_limit,
            strict=False,  # the summary is printed before a failed check ends the command
            progress=init.progress,
            overwrite=init.overwrite,
            sanity_samples=init.sanity_samples,
        )
    return plan, init.strict


def main(args: list[str] | None = None) -> Path:
    """Entry point of ``lightning-bandlimit robustness``: parse, evaluate, print the summary.

    ``--config`` takes a YAML file or a packaged recipe's name (``robustness``); every other
    option of :func:`evaluate_robustness` is a flag (its defaults and help come from its
    signature), plus ``--models`` (name -> checkpoint), ``--main_run PATH|latest`` and
    ``--runs_dir``. Prints the Markdown summary to stdout. A bad value (an unknown option or
    attack, a budget out of range, a missing checkpoint, ...) ends the command before any
    work with one line ``lightning-bandlimit robustness: error: ...`` on stderr and exit
    status 2.

    Args:
        args: the arguments after the subcommand (default ``sys.argv[1:]``).

    Returns:
        The output folder.

    Raises:
        SystemExit: with status 2 for a bad value, 0 after ``--help``.
        SanityCheckError: when ``--strict`` (the default) and a sanity check failed, after all
            outputs are written and the summary printed.

    Example:
        >>> main(["--config", "robustness", "--limit", "64"])  # doctest: +SKIP
        PosixPath('runs/robustness-20250101-120000')
    """
    from jsonargparse import ArgumentError

    argv = sys.argv[1:] if args is None else list(args)
    try:
        plan, strict = _plan(argv)
    except (ArgumentError, *_INPUT_ERRORS) as error:
        _fail(error)
    with torch.inference_mode(False), torch.enable_grad():
        report = run_plan(plan)
    print(report.summary)
    if strict and not report.passed:
        raise SanityCheckError(report.failed_checks, str(plan.output_dir))
    return plan.output_dir


if __name__ == "__main__":
    main()
