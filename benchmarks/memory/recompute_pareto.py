"""Each exact checkpointing rung of ours, bytes freed against step time, beside PyTorch's own tools.

For each model (the quickstart model, ``cifar_resnet18(width=8)`` at 32 px; torchvision's
``resnet18``, ``resnet50`` and ``densenet121`` built without weights, 10 classes, 64 px; all plain
``nn.Conv2d``, float32, CPU) a training step (forward, cross-entropy, backward, SGD step) runs in
each of these configurations, each a point (MiB freed, step time / plain step time):

1. **plain**: nothing checkpointed (0 bytes, 1.0x).
2. **ours (cost order)**: every rung of :meth:`UnitProfile.plan` as ``AdaptiveBandLimit``'s
   default ``rung_order="cost"`` builds them (full moves only where ``plan`` takes
   ``pointwise``; the profile taken on a warm plain forward), switched by
   :meth:`CheckpointRungs.apply`; **ours (pointwise)**: ``plan(pointwise=True)``
   (``rung_order="pointwise"``: each unit's pointwise move before its full one), where its
   rungs differ from the cost order's.
3. **ours (stages)**: every rung of :meth:`UnitProfile.stages` (rung ``r``: the first ``r``
   resolution stages checkpointed in full).
4. **torch checkpoint**: ``torch.utils.checkpoint.checkpoint(unit, ..., use_reentrant=False)`` on
   the first ``k`` units (in the order they run) for ``k`` = 1, n/4, n/2, 3n/4, n, through plain
   forward wrappers of this script's own (the arguments flattened into their tensors at call
   time, as DenseNet's list of features needs: vision #2221); for ``densenet121`` also
   torchvision's own ``memory_efficient=True``.
5. **torch selective** ("save convolutions, recompute the rest"): the same wrappers with
   ``context_fn=create_selective_checkpoint_contexts(policy)``, the policy ``MUST_SAVE`` for
   ``aten.convolution``/``mm``/``addmm`` and ``PREFER_RECOMPUTE`` otherwise, on all units and on
   the first half (``respect_saved_tensors_hooks=True`` where torch takes it, so the meter sees
   what it saves).
6. **torch.compile** (inductor) with ``torch._functorch.config.activation_memory_budget`` = 1.0
   (the compiled baseline), 0.5, 0.2 (one compiled callable per budget, the budget patched around
   its compile; compile time excluded: warmed up first). Only where inductor works here (it needs
   a C++ compiler); a model whose compiles take more than ``--compile-limit`` seconds (180) is
   skipped for this tool. Its time ratio is given against eager plain and against compiled
   budget 1.0.

**Bytes freed**: :class:`SavedTensorMeter` (parameters excluded) over one training forward,
plain minus the configuration (a non-reentrant checkpoint's inputs are among what it sees: torch
saves them through the hooks; any checkpoint input it did not see would be added, ``held_bytes``;
for the compiled ones: around the compiled forward, checked by comparing budget 1.0 with eager
plain, ``null`` where the meter does not see the compiled graph). **Step time**: all
configurations of one model measured round-robin (``--rounds`` rounds of ``--steps`` steps
each, the order rotated each round, after warm-up steps), so that machine noise hits all alike;
the ratio is the median of the configuration's round times over plain's (the paired per-round
ratios are kept beside it; ``--statistic min`` takes the fastest round instead, for a busy
machine, where other jobs only ever slow a step down; a model whose plain rounds differ by more
than 1.5x is flagged).

Per rung of ours: **dominated** (a torch point, 4-6, frees at least as many bytes in less step
time, torch.compile's time taken against its compiled budget 1.0, i.e. without inductor's own
speed-up, which is no checkpointing; also given with its time against eager plain: the target is
that none does, every rung on or below the torch tools' Pareto front) and the
**floor ratio** (the rung's overhead, time ratio - 1, over its recompute floor: the forward time
of what it recomputes, a unit's whole forward for a full move and its forward less its
convolutions' and linear layers' for a pointwise move, over the plain step time; per-unit times
from forward hooks over one plain training forward in each timing round, median; target <= 1.3).
Prints a table per model and PASS/FAIL lines; writes ``results/recompute_pareto.json`` and
``results/recompute_pareto.png``.

Run: ``.venv/bin/python -m benchmarks.memory.recompute_pareto`` (all four models: about 15
minutes on 2 CPU cores, half of it inductor's compiles; ``--no-compile`` about 8). ``--quick``: a
tiny quickstart model, a few seconds. The step times are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import shutil
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from benchmarks.common.plotting import pyplot
from benchmarks.common.provenance import RESULTS, stamp
from lightning_bandlimit.models import cifar_resnet18
from lightning_bandlimit.recompute.plan import parse_move
from lightning_bandlimit.recompute.pointwise import LAYER_TYPES
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.unit_choice import checkpoint_units
from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.versions import library_versions

MIB = 2**20
OURS = ("ours (cost order)", "ours (pointwise)", "ours (stages)")
TORCH_CHECKPOINT, TORCH_SELECTIVE, TORCH_COMPILE = "torch checkpoint", "torch selective", "torch.compile"
TORCH_TOOLS = (TORCH_CHECKPOINT, TORCH_SELECTIVE, TORCH_COMPILE)
FLOOR_TARGET = 1.3
NOISY = 1.5  # plain's slowest round over its fastest beyond which a model's timings are flagged
SAVED_BY_POLICY = tuple(
    getattr(torch.ops.aten, name).default
    for name in ("convolution", "mm", "addmm")
    if hasattr(torch.ops.aten, name)
)
RESPECTS_HOOKS = (
    "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one benchmarked model and feed it."""

    build: Callable[[], nn.Module]
    pixels: int
    batch: int


def _torchvision(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=10)

    return build


MODELS: dict[str, ModelSpec] = {
    "quickstart": ModelSpec(lambda: cifar_resnet18(width=8), 32, 128),
    "resnet18": ModelSpec(_torchvision("resnet18"), 64, 48),
    "resnet50": ModelSpec(_torchvision("resnet50"), 64, 24),
    "densenet121": ModelSpec(_torchvision("densenet121"), 64, 24),
}
QUICK = ModelSpec(lambda: cifar_resnet18(width=4), 32, 8)


# --------------------------------------------------------------------------------------------
# the configurations


@dataclass
class Config:
    """One point: how to switch the model to it and back, and what it recomputes."""

    series: str
    label: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    enter: Callable[[], None] = lambda: None
    leave: Callable[[], None] = lambda: None
    rung: int | None = None
    moves: list[str] = field(default_factory=list)  # what this rung adds (ours)
    modes: dict[str, str] | None = None  # unit -> "full" / "pointwise" recomputed (for the floor)
    budget: float | None = None
    planned_bytes: float | None = None  # ours (cost order): the plan's estimate, cumulative


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Save convolutions' and matrix products' outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_BY_POLICY else CheckpointPolicy.PREFER_RECOMPUTE


def torch_checkpointed(function: Callable[..., Any], selective: bool) -> Callable[..., Any]:
    """``function`` run through ``torch.utils.checkpoint.checkpoint`` (non-reentrant) when grad is
    on, its arguments flattened into their tensors at call time (a list the caller appends to
    later, as DenseNet's blocks do, must not change the recompute)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return function(*args, **kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        places = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

        def run(*tensors: torch.Tensor) -> Any:
            values = list(leaves)
            for i, tensor in zip(places, tensors, strict=True):
                values[i] = tensor
            call_args, call_kwargs = pytree.tree_unflatten(values, spec)
            return function(*call_args, **call_kwargs)

        extra: dict[str, Any] = {}
        if selective:
            extra["context_fn"] = functools.partial(create_selective_checkpoint_contexts, selective_policy)
            if RESPECTS_HOOKS:
                extra["respect_saved_tensors_hooks"] = True
        return torch.utils.checkpoint.checkpoint(
            run, *(leaves[i] for i in places), use_reentrant=False, **extra
        )

    return forward


def wrap_units(
    modules: Sequence[nn.Module], selective: bool
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``(enter, leave)``: install and remove the checkpointing forward wrappers on ``modules``."""

    def enter() -> None:
        for module in modules:
            module.forward = torch_checkpointed(module.forward, selective)  # type: ignore[method-assign]

    def leave() -> None:
        for module in modules:
            module.__dict__.pop("forward", None)

    return enter, leave


def torch_configs(model: nn.Module, units: dict[str, nn.Module], order: list[str]) -> list[Config]:
    """Points 4 and 5: torch's checkpoint on the first k units, its selective policy on all and
    half, and torchvision's DenseNet ``memory_efficient``."""
    n = len(order)
    configs = []
    for k in sorted({max(1, round(n * f)) for f in (0.0, 0.25, 0.5, 0.75, 1.0)}):
        enter, leave = wrap_units([units[u] for u in order[:k]], selective=False)
        configs.append(
            Config(
                TORCH_CHECKPOINT,
                f"first {k}/{n}",
                model,
                enter,
                leave,
                modes=dict.fromkeys(order[:k], "full"),
            )
        )
    for k in sorted({max(1, n // 2), n}):
        enter, leave = wrap_units([units[u] for u in order[:k]], selective=True)
        modes = dict.fromkeys(order[:k], "pointwise")
        configs.append(Config(TORCH_SELECTIVE, f"first {k}/{n}", model, enter, leave, modes=modes))
    dense = [
        m for m in model.modules() if type(m).__name__ == "_DenseLayer" and hasattr(m, "memory_efficient")
    ]
    if dense:

        def switch(on: bool) -> None:
            for layer in dense:
                layer.memory_efficient = on

        configs.append(
            Config(
                TORCH_CHECKPOINT,
                "densenet memory_efficient",
                model,
                functools.partial(switch, True),
                functools.partial(switch, False),
            )
        )
    return configs


def rung_orders(profile: Any) -> tuple[dict[str, tuple[list[list[str]], list[float] | None]], dict[str, str]]:
    """Our rung orders from one profile, as ``AdaptiveBandLimit``'s ``rung_order`` builds them:
    ``"cost"`` (:meth:`UnitProfile.plan`; full moves only where ``plan`` takes ``pointwise``),
    ``"pointwise"`` (each unit's pointwise move before its full one; left out where its rungs
    are the cost order's) and ``"stages"``; with notes on what was left out."""
    takes_pointwise = "pointwise" in inspect.signature(profile.plan).parameters
    notes: dict[str, str] = {}
    cost = profile.plan(pointwise=False) if takes_pointwise else profile.plan()
    orders: dict[str, tuple[list[list[str]], list[float] | None]] = {OURS[0]: (cost.rungs, cost.savings)}
    if not takes_pointwise:
        notes[OURS[1]] = "UnitProfile.plan has no pointwise switch: the cost order holds the pointwise moves"
    else:
        pointwise = profile.plan(pointwise=True)
        if pointwise.rungs != cost.rungs:
            orders[OURS[1]] = (pointwise.rungs, pointwise.savings)
        else:
            notes[OURS[1]] = "plan(pointwise=True) gave the cost order's rungs (no pointwise move): left out"
    orders[OURS[2]] = (profile.stages(), None)
    return orders, notes


def our_configs(
    model: nn.Module,
    stages: CheckpointRungs,
    orders: dict[str, tuple[list[list[str]], list[float] | None]],
) -> list[Config]:
    """Points 2 and 3: every rung of the cost-ordered plan and of the stages."""
    configs = []
    for series, (rungs, savings) in orders.items():

        def enter(rungs: list[list[str]] = rungs, r: int = 0) -> None:
            stages.set_stages(rungs)
            stages.apply(r)

        def leave() -> None:
            stages.apply(0)

        for r in range(1, len(rungs) + 1):
            stages.set_stages(rungs)
            configs.append(
                Config(
                    series,
                    f"rung {r}",
                    model,
                    functools.partial(enter, rungs, r),
                    leave,
                    rung=r,
                    moves=list(rungs[r - 1]),
                    modes=stages.modes_at(r),
                    planned_bytes=None if savings is None else sum(savings[:r]),
                )
            )
    stages.apply(0)
    return configs


# --------------------------------------------------------------------------------------------
# torch.compile


class CompileTimeout(Exception):
    """The compiles of one model ran past their limit."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`CompileTimeout` in the main thread after ``seconds`` (where SIGALRM exists)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(*_: Any) -> None:
        raise CompileTimeout(f"compiles ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def inductor_unavailable() -> str | None:
    """Why inductor cannot compile here (``None``: it may)."""
    compiler = os.environ.get("CXX", "c++")
    if not any(shutil.which(c) for c in (compiler, "g++", "clang++")):
        return f"no C++ compiler ({compiler}, g++, clang++) on PATH"
    return None


def budget_backend(budget: float) -> Callable[..., Any]:
    """Inductor with ``activation_memory_budget=budget`` while it partitions the joint graph; a
    backend object of its own, so that each budget keeps its own cache entry."""
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: Any, example_inputs: Any) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compile_fx(graph, example_inputs)

    return backend


def compiled_configs(
    model: nn.Module, budgets: Sequence[float], warm: Callable[[Callable[..., Any]], None], limit: float
) -> tuple[list[Config], dict[str, Any]]:
    """Point 6: one compiled callable per budget, compiled and warmed up here (``warm``), within
    ``limit`` seconds for all; ``([], info)`` with the reason where inductor is unavailable."""
    info: dict[str, Any] = {
        "budgets": list(budgets),
        "compile_seconds": {},
        "cache_note": "compile_seconds include the warm-up steps; inductor's on-disk caches shorten them",
    }
    reason = inductor_unavailable()
    if reason is not None:
        return [], {**info, "available": False, "reason": f"unavailable: {reason}"}
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    torch._dynamo.reset()
    configs = []
    started = time.perf_counter()
    try:
        for budget in budgets:
            compiled = torch.compile(model, backend=budget_backend(budget))
            begun = time.perf_counter()
            with (
                deadline(limit - (begun - started)),
                torch._functorch.config.patch(activation_memory_budget=budget),
            ):
                warm(compiled)
            info["compile_seconds"][str(budget)] = round(time.perf_counter() - begun, 1)
            configs.append(Config(TORCH_COMPILE, f"budget {budget:g}", compiled, budget=budget))
            spent = time.perf_counter() - started
            projected = spent / len(configs) * len(budgets)
            if len(configs) < len(budgets) and projected > limit:
                raise CompileTimeout(
                    f"{len(configs)} of {len(budgets)} budgets compiled in {spent:.0f} s: all would take "
                    f"about {projected:.0f} s, past {limit:.0f} s"
                )
    except CompileTimeout as error:
        torch._dynamo.reset()
        return [], {**info, "available": False, "reason": f"skipped for this model: {error}"}
    except Exception as error:  # noqa: BLE001 - any compile failure: the tool is unavailable here
        torch._dynamo.reset()
        return [], {
            **info,
            "available": False,
            "reason": f"unavailable: {type(error).__name__}: {error}"[:500],
        }
    return configs, {**info, "available": True, "reason": None}


# --------------------------------------------------------------------------------------------
# measuring


def train_step(
    forward: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
) -> None:
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(forward(x), y).backward()
    optimizer.step()


@contextlib.contextmanager
def checkpoint_inputs() -> Iterator[dict[int, int]]:
    """The storages (``data_ptr -> bytes``) of the tensors handed to
    ``torch.utils.checkpoint.checkpoint`` with grad on while inside: a non-reentrant checkpoint
    holds its inputs until backward outside the saved-tensor hooks, where no meter sees them."""
    held: dict[int, int] = {}
    original = torch.utils.checkpoint.checkpoint

    @functools.wraps(original)
    def recording(function: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            for leaf in pytree.tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor):
                    held[leaf.untyped_storage().data_ptr()] = leaf.untyped_storage().nbytes()
        return original(function, *args, **kwargs)

    torch.utils.checkpoint.checkpoint = recording
    try:
        yield held
    finally:
        torch.utils.checkpoint.checkpoint = original


@dataclass(frozen=True)
class Kept:
    """What one training forward keeps for backward, parameters excluded."""

    saved: int  # the unique storages saved for backward (SavedTensorMeter)
    held: int  # checkpoint inputs besides them (held by the checkpoints, unseen by the meter)
    count: int  # storages the meter saw

    @property
    def total(self) -> int:
        return self.saved + self.held


def kept_bytes(
    model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> Kept:
    """What one training forward keeps for backward; the backward runs afterwards (the graph is
    let go)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with checkpoint_inputs() as held, SavedTensorMeter(exclude=model.parameters()) as meter:
        loss = nn.functional.cross_entropy(forward(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    seen = {pointer for storages in meter.storages_by_label().values() for pointer in storages}
    extra = sum(size for pointer, size in held.items() if pointer not in seen and pointer not in parameters)
    return Kept(meter.bytes, extra, meter.count)


class UnitTimer:
    """Each unit's forward time and its convolutions' and linear layers', from forward hooks over
    plain training forwards (one per call: the timing rounds make one each, so that the machine's
    bursts of load hit these as they hit the steps); :meth:`medians` over the calls."""

    def __init__(
        self, model: nn.Module, units: dict[str, nn.Module], x: torch.Tensor, y: torch.Tensor
    ) -> None:
        self.model, self.units, self.x, self.y = model, units, x, y
        self.whole: dict[str, list[float]] = {name: [] for name in units}
        self.layers: dict[str, list[float]] = {name: [] for name in units}

    def __call__(self) -> None:
        started: dict[Any, float] = {}

        def pre(module: nn.Module, _: Any) -> None:
            started[module] = time.perf_counter()

        def post(module: nn.Module, _: Any, __: Any, name: str, into: dict[str, list[float]]) -> None:
            into[name][-1] += time.perf_counter() - started.pop(module)

        handles = []
        for name, unit in self.units.items():
            self.whole[name].append(0.0)
            self.layers[name].append(0.0)
            hook = functools.partial(post, name=name, into=self.whole)
            handles += [unit.register_forward_pre_hook(pre), unit.register_forward_hook(hook)]
            for layer in unit.modules():
                if isinstance(layer, LAYER_TYPES):
                    hook = functools.partial(post, name=name, into=self.layers)
                    handles += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(hook)]
        try:
            loss = nn.functional.cross_entropy(self.model(self.x), self.y)
        finally:
            for handle in handles:
                handle.remove()
        loss.backward()
        self.model.zero_grad(set_to_none=True)

    def medians(
        self, stat: Callable[[Sequence[float]], float] = statistics.median
    ) -> tuple[dict[str, float], dict[str, float]]:
        return (
            {n: stat(t) for n, t in self.whole.items()},
            {n: stat(t) for n, t in self.layers.items()},
        )


def recompute_floor(
    modes: dict[str, str] | None,
    seconds: dict[str, float],
    layer_seconds: dict[str, float],
    plain_step: float,
) -> float | None:
    """The forward time of what ``modes`` recompute, over the plain step time."""
    if modes is None:
        return None
    total = sum(
        seconds[u] if mode == "full" else max(0.0, seconds[u] - layer_seconds.get(u, 0.0))
        for u, mode in modes.items()
    )
    return total / plain_step


def time_rounds(
    configs: list[Config],
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    rounds: int,
    steps: int,
    extra: Callable[[], None] | None = None,
) -> list[list[float]]:
    """Per configuration, its mean step time in each round (round-robin, the order rotated);
    ``extra`` runs once a round, in the rotation as one more configuration."""
    means: list[list[float]] = [[] for _ in configs]
    slots = len(configs) + (extra is not None)
    for r in range(rounds):
        shift = r % slots
        for i in [*range(shift, slots), *range(shift)]:
            if i == len(configs):
                extra()  # type: ignore[misc]
                continue
            config = configs[i]
            config.enter()
            try:
                started = time.perf_counter()
                for _ in range(steps):
                    train_step(config.forward, optimizer, x, y)
                means[i].append((time.perf_counter() - started) / steps)
            finally:
                config.leave()
    return means


def dominated_by(
    point: dict[str, Any], others: Sequence[dict[str, Any]], ratio_key: str = "time_ratio"
) -> list[str]:
    """Labels of the points in ``others`` that free at least as many bytes as ``point`` in less
    step time (points without bytes or times are left out)."""
    if point.get("bytes_freed") is None or point.get(ratio_key) is None:
        return []
    return [
        f"{o['series']} {o['label']}"
        for o in others
        if o.get("bytes_freed") is not None
        and o.get(ratio_key) is not None
        and o["bytes_freed"] >= point["bytes_freed"]
        and o[ratio_key] < point[ratio_key]
    ]


def measure_model(
    name: str,
    spec: ModelSpec,
    batch: int,
    rounds: int,
    steps: int,
    warmup: int = 2,
    budgets: Sequence[float] = (1.0, 0.5, 0.2),
    compile_limit: float = 180.0,
    log: Callable[[str], None] = print,
    statistic: str = "median",
) -> dict[str, Any]:
    """Every configuration's point for one model, and the checks of our rungs; ``statistic``
    (``"median"`` or ``"min"``) of the rounds' step times and of the units' forward times."""
    stat: Callable[[Sequence[float]], float] = {"median": statistics.median, "min": min}[statistic]
    torch.manual_seed(0)
    model = spec.build().train()
    x, y = torch.randn(batch, 3, spec.pixels, spec.pixels), torch.randint(0, 10, (batch,))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    plain = Config("plain", "plain", model)
    for _ in range(warmup):
        train_step(model, optimizer, x, y)
    units = dict(checkpoint_units(model))
    stages = CheckpointRungs(list(units.items()))
    with stages.profile(exclude=model.parameters()) as profile:
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    orders, order_notes = rung_orders(profile)
    order = list(profile.order)
    configs = [plain]
    configs += our_configs(model, stages, orders)
    configs += torch_configs(model, {u: units[u] for u in order}, order)

    def warm(forward: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for _ in range(warmup):
            train_step(forward, optimizer, x, y)

    compile_info: dict[str, Any] = {"available": False, "reason": "not asked (--no-compile)", "budgets": []}
    if budgets:
        log(f"[{name}] compiling at budgets {list(budgets)} ...")
        compiled, compile_info = compiled_configs(model, budgets, warm, compile_limit)
        configs += compiled
        log(f"[{name}] torch.compile: {compile_info['reason'] or 'ok'} {compile_info['compile_seconds']}")

    log(f"[{name}] {len(configs)} configurations: warm-up and bytes ...")
    measured: list[Kept] = []
    for config in configs:
        config.enter()
        try:
            warm(config.forward)
            measured.append(kept_bytes(model, config.forward, x, y))
        finally:
            config.leave()
    timer = UnitTimer(model, units, x, y)
    log(f"[{name}] timing {rounds} rounds x {steps} steps ...")
    means = time_rounds(configs, optimizer, x, y, rounds, steps, extra=timer)
    seconds, layer_seconds = timer.medians(stat)

    plain_bytes = measured[0].total
    plain_step = stat(means[0])
    compiled_base = next(
        (i for i, c in enumerate(configs) if c.series == TORCH_COMPILE and c.budget == 1.0), None
    )
    bytes_note = None
    if compile_info.get("available") and compiled_base is not None:
        seen, count = measured[compiled_base].total, measured[compiled_base].count
        if count == 0 or not 0.25 * plain_bytes <= seen <= 4 * plain_bytes:
            bytes_note = (
                f"the meter saw {seen / MIB:.1f} MiB in {count} storages around the compiled forward at "
                f"budget 1.0 against {plain_bytes / MIB:.1f} MiB eager: not the compiled graph's activations"
            )
        else:
            bytes_note = (
                f"the meter sees the compiled graph's saved tensors: {seen / MIB:.1f} MiB ({count} storages) "
                f"at budget 1.0 against {plain_bytes / MIB:.1f} MiB eager plain"
            )
        compile_info["bytes_seen"] = count > 0 and 0.25 * plain_bytes <= seen <= 4 * plain_bytes
        compile_info["bytes_note"] = bytes_note
    points = []
    for i, config in enumerate(configs):
        ratios = [m / p for m, p in zip(means[i], means[0], strict=True)]
        ratio = stat(means[i]) / plain_step
        freed: int | None = plain_bytes - measured[i].total
        if config.series == TORCH_COMPILE and not compile_info.get("bytes_seen", False):
            freed = None
        floor = recompute_floor(config.modes, seconds, layer_seconds, plain_step)
        point: dict[str, Any] = {
            "series": config.series,
            "label": config.label,
            "rung": config.rung,
            "moves": config.moves,
            "units_recomputed": None if config.modes is None else len(config.modes),
            "saved_bytes": measured[i].saved,
            "held_bytes": measured[i].held,
            "bytes_freed": freed,
            "mib_freed": None if freed is None else round(freed / MIB, 3),
            "planned_mib_freed": None
            if config.planned_bytes is None
            else round(config.planned_bytes / MIB, 3),
            "step_seconds": stat(means[i]),
            "time_ratio_median": statistics.median(means[i]) / statistics.median(means[0]),
            "time_ratio_min": min(means[i]) / min(means[0]),
            "time_ratio": ratio,
            "round_ratios": [round(r, 4) for r in ratios],
            "floor": floor,
            "floor_ratio": None if floor is None or floor <= 0 else (ratio - 1) / floor,
        }
        if config.series == TORCH_COMPILE:
            point["budget"] = config.budget
            if compiled_base is not None:
                point["time_ratio_vs_compiled"] = stat(means[i]) / stat(means[compiled_base])
        points.append(point)
    torch._dynamo.reset()
    stages.release()

    torch_points = [p for p in points if p["series"] in TORCH_TOOLS]
    # compiled points' time against compiled budget 1.0: the memory-for-time trade, without
    # inductor's own speed-up (which is no checkpointing); the absolute one (vs eager) beside it
    compile_relative = [
        {**p, "time_ratio": p.get("time_ratio_vs_compiled", p["time_ratio"])} for p in torch_points
    ]
    checks = []
    for p in points:
        if p["series"] not in OURS:
            continue
        by = dominated_by(p, compile_relative)
        checks.append(
            {
                "series": p["series"],
                "rung": p["rung"],
                "moves": p["moves"],
                "mib_freed": p["mib_freed"],
                "time_ratio": p["time_ratio"],
                "floor": p["floor"],
                "floor_ratio": p["floor_ratio"],
                "floor_ok": p["floor_ratio"] is not None and p["floor_ratio"] <= FLOOR_TARGET,
                "dominated": bool(by),
                "dominated_by": by,
                "dominated_vs_eager_plain": bool(dominated_by(p, torch_points)),
                "dominated_by_vs_eager_plain": dominated_by(p, torch_points),
            }
        )
    return {
        "batch": batch,
        "pixels": spec.pixels,
        "units": len(units),
        "unit_order": order,
        "plain_saved_bytes": plain_bytes,
        "plain_saved_mib": round(plain_bytes / MIB, 3),
        "plain_step_seconds": plain_step,
        "plain_round_seconds": means[0],
        # the slowest round of plain over its fastest: near 1 on a quiet machine
        "plain_round_spread": max(means[0]) / min(means[0]),
        "statistic": statistic,
        "rungs": {series: rungs for series, (rungs, _) in orders.items()},
        "planned_savings_mib": {
            series: [round(s / MIB, 3) for s in savings] for series, (_, savings) in orders.items() if savings
        },
        "rung_order_notes": order_notes,
        "unit_forward_seconds": seconds,
        "unit_layer_seconds": layer_seconds,
        "profile_unit_seconds": dict(profile.seconds),
        "profile_layer_seconds": dict(profile.layer_seconds),
        "compile": compile_info,
        "points": points,
        "checks": checks,
    }


# --------------------------------------------------------------------------------------------
# reporting


def _moves_text(moves: list[str], width: int = 34) -> str:
    short = [("pw:" if parse_move(m)[1] == "pointwise" else "") + parse_move(m)[0] for m in moves]
    text = f"+{len(moves)}: " + ", ".join(short)
    return text if len(text) <= width else text[: width - 3] + "..."


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(name: str, result: dict[str, Any], log: Callable[[str], None] = print) -> None:
    log(
        f"\n{name}: batch {result['batch']}, {result['pixels']} px, {result['units']} units, plain step "
        f"{result['plain_step_seconds'] * 1e3:.0f} ms ({result['statistic']} of rounds; slowest/fastest "
        f"{result['plain_round_spread']:.2f}), plain saved {result['plain_saved_mib']:.1f} MiB"
    )
    if result["plain_round_spread"] > NOISY:
        log(f"WARNING: plain's rounds differ by more than {NOISY}x: a busy machine, the ratios are noise")
    for series, note in result.get("rung_order_notes", {}).items():
        log(f"{series}: {note}")
    checks = {(c["series"], c["rung"]): c for c in result["checks"]}
    log(
        f"{'series':<18} {'rung/label':<26} {'moves':<34} {'MiB':>7} {'ratio':>6} {'floor':>6} {'fl.r':>5} "
        "dominated (torch.compile vs compiled 1.0) [also vs eager plain]"
    )
    for p in result["points"]:
        c = checks.get((p["series"], p["rung"]))
        label = f"rung {p['rung']}" if p["rung"] is not None else p["label"]
        if p["series"] == TORCH_COMPILE and p.get("time_ratio_vs_compiled") is not None:
            label += f" ({p['time_ratio_vs_compiled']:.2f}x vs c1.0)"
        dominated = "-"
        if c is not None:
            dominated = "yes: " + ", ".join(c["dominated_by"]) if c["dominated"] else "no"
            dominated = f"[{'yes' if c['dominated_vs_eager_plain'] else 'no'}] {dominated}"
        log(
            f"{p['series']:<18} {label:<26} {_moves_text(p['moves']) if p['moves'] else '':<34} "
            f"{_f(p['mib_freed'], '7.2f'):>7} {p['time_ratio']:6.3f} {_f(p['floor'], '6.3f'):>6} "
            f"{_f(p['floor_ratio'], '5.2f'):>5} {dominated[:80]}"
        )


def verdicts(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """PASS/FAIL for the two targets, per series of ours (the cost order is the one that counts)."""
    out: dict[str, Any] = {}
    for series in [s for s in OURS if any(c["series"] == s for r in results.values() for c in r["checks"])]:
        checks = [(m, c) for m, r in results.items() for c in r["checks"] if c["series"] == series]
        dominated = [f"{m} rung {c['rung']}" for m, c in checks if c["dominated"]]
        absolute = [f"{m} rung {c['rung']}" for m, c in checks if c["dominated_vs_eager_plain"]]
        over = [
            f"{m} rung {c['rung']} ({_f(c['floor_ratio'], '.2f')})" for m, c in checks if not c["floor_ok"]
        ]
        out[series] = {
            "pareto": "PASS" if not dominated else "FAIL",
            "dominated": dominated,
            "pareto_vs_eager_plain": "PASS" if not absolute else "FAIL",
            "dominated_vs_eager_plain": absolute,
            "floor": "PASS" if not over else "FAIL",
            "floor_over": over,
        }
    return out


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    plt = pyplot()

    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4.2), squeeze=False)
    styles = {
        "plain": ("k", "o"),
        OURS[0]: ("tab:red", "o"),
        OURS[1]: ("tab:brown", "v"),
        OURS[2]: ("tab:orange", "s"),
        TORCH_CHECKPOINT: ("tab:blue", "^"),
        TORCH_SELECTIVE: ("tab:green", "D"),
        TORCH_COMPILE: ("tab:purple", "*"),
    }
    for ax, name in zip(axes[0], names, strict=True):
        points = results[name]["points"]
        for series, (color, marker) in styles.items():
            chosen = [p for p in points if p["series"] == series and p["mib_freed"] is not None]
            if not chosen:
                continue
            xs = [p["mib_freed"] for p in chosen]
            ys = [p["time_ratio"] for p in chosen]
            if series in OURS:
                xs, ys = [0.0, *xs], [1.0, *ys]
            style = "-" if series in OURS else "none"
            label = series + (" (vs eager plain)" if series == TORCH_COMPILE else "")
            ax.plot(xs, ys, linestyle=style, marker=marker, color=color, label=label, markersize=6)
            if series == TORCH_CHECKPOINT:
                for p in chosen:
                    if "memory_efficient" in p["label"]:
                        ax.annotate("memory_efficient", (p["mib_freed"], p["time_ratio"]), fontsize=7)
            relative = [p for p in chosen if p.get("time_ratio_vs_compiled") is not None]
            if series == TORCH_COMPILE and relative:
                ax.plot(
                    [p["mib_freed"] for p in relative],
                    [p["time_ratio_vs_compiled"] for p in relative],
                    linestyle="none",
                    marker=marker,
                    markerfacecolor="none",
                    color=color,
                    label=f"{series} (vs compiled budget 1.0)",
                    markersize=8,
                )
        r = results[name]
        ax.set_title(f"{name} (batch {r['batch']}, {r['pixels']} px)")
        ax.set_xlabel("MiB freed (saved for backward, vs plain)")
        ax.set_ylabel("step time / plain step time")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument(
        "--batch", type=int, default=None, help="the batch of every model (default: each its own)"
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1, help="timed steps per configuration per round")
    parser.add_argument(
        "--statistic",
        choices=("median", "min"),
        default="median",
        help="of the rounds' step times (and the units' forward times); min: on a busy machine",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration first")
    parser.add_argument("--budgets", type=float, nargs="*", default=[1.0, 0.5, 0.2])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--compile-limit", type=float, default=180.0, help="seconds for one model's compiles")
    parser.add_argument("--output", type=Path, default=RESULTS / "recompute_pareto.json")
    parser.add_argument("--figure", type=Path, default=None, help="default: the output's name with .png")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch's intra-op threads (default: its own)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny quickstart model, no compile (tests)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the figure from --output's JSON")
    args = parser.parse_args(argv)
    if args.plot_only:
        document = json.loads(args.output.read_text())
        plot(document["models"], args.figure or args.output.with_suffix(".png"))
        return document
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 1, 1
        args.no_compile = True
    budgets = [] if args.no_compile else list(args.budgets)
    if budgets and 1.0 not in budgets:
        budgets = [1.0, *budgets]
    torch.set_flush_denormal(True)  # process-wide: set back before returning (tests call main)
    try:
        return _measure_all(args, budgets)
    finally:
        torch.set_flush_denormal(False)


def _measure_all(args: argparse.Namespace, budgets: list[float]) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = os.getloadavg()
    results = {}
    for name in ["quickstart"] if args.quick else args.models:
        spec = QUICK if args.quick else MODELS[name]
        batch = args.batch or spec.batch
        results[name] = measure_model(
            name,
            spec,
            batch,
            args.rounds,
            args.steps,
            args.warmup,
            budgets,
            args.compile_limit,
            statistic=args.statistic,
        )
        print_table(name, results[name])
    verdict = verdicts(results)
    print()
    for series, v in verdict.items():
        main_series = series == OURS[0]
        tag = "" if main_series else " (informational)"
        print(
            f"{v['pareto']}: {series}{tag}: no rung dominated by a torch tool point (torch.compile's time "
            "against compiled budget 1.0)"
            + (f"; dominated: {', '.join(v['dominated'])}" if v["dominated"] else "")
        )
        print(
            f"{v['pareto_vs_eager_plain']}: {series}{tag}: the same with torch.compile's absolute step time "
            "(its inductor speed-up counted)"
            + (
                f"; dominated: {', '.join(v['dominated_vs_eager_plain'])}"
                if v["dominated_vs_eager_plain"]
                else ""
            )
        )
        print(
            f"{v['floor']}: {series}{tag}: every rung's overhead within {FLOOR_TARGET}x its recompute floor"
            + (f"; over: {', '.join(v['floor_over'])}" if v["floor_over"] else "")
        )
    inductor = {m: r["compile"]["reason"] or "ok" for m, r in results.items()}
    print(f"torch.compile: {inductor}")
    document = {
        "benchmark": "recompute_pareto",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "versions": library_versions(["torch", "torchvision", "lightning-bandlimit"]),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "seconds": round(time.perf_counter() - started, 1),
        "respect_saved_tensors_hooks": RESPECTS_HOOKS,
        "floor_source": (
            "per-unit forward times re-measured with forward hooks, one plain training forward per timing "
            "round (median over rounds); a pointwise move's floor is the unit's forward less its "
            "Conv/Linear layers'"
        ),
        "profile_note": "the plan is profiled on a warm plain forward (after --warmup steps)",
        "dominated_rule": (
            "a torch point (checkpoint, selective; torch.compile with its time against compiled budget 1.0) "
            "frees at least as many bytes (vs eager plain) in less step time; *_vs_eager_plain: the same "
            "with torch.compile's time against eager plain (inductor's own speed-up counted)"
        ),
        "time_rule": (
            f"the {args.statistic} over rounds of the step time over plain's (time_ratio_median and "
            "time_ratio_min both kept; round_ratios: paired per round)"
        ),
        "models": results,
        "verdicts": verdict,
    }
    atomic_write_json(args.output, {**stamp("benchmarks.memory.recompute_pareto"), **document}, default=str)
    figure = args.figure or args.output.with_suffix(".png")
    plot(results, figure)
    print(f"wrote {args.output} and {figure} ({document['seconds']:.0f} s)")
    return document


if __name__ == "__main__":
    main()
