"""The conformance cells of the model zoo, one function per lever; shared by ``tests/zoo`` and
``benchmarks/zoo/zoo_matrix.py``.

Each cell builds its own model (so one failure does not spill into another), raises
``AssertionError`` when the model does not conform and returns a small dict of what it measured.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer, simulate_device
from torch import nn
from zoo.models import batch, build

from lightning_bandlimit import SavedTensorMeter, bandlimit, set_compression
from lightning_bandlimit.ladder import LadderController, Setting
from lightning_bandlimit.microbatch import split_batch, split_trial
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.trial import trial
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

SEED = 1234
FLOOR = 1.0  # each gradient's error is relative to max(its norm, FLOOR * the norm of all)
CELLS = (
    "c0_equals_plain",
    "c05_step",
    "rungs_exact_c0",
    "rungs_exact_c05",
    "cost_rungs_exact",
    "step_squeeze",
    "ladder_in_trainer",
    "bf16",
    "channels_last",
    "compile",
    "split",
    "trainer_exact",
)
#: the models the ``compile`` cell runs on (torch.compile is slow to warm up on CPU)
COMPILE_MODELS = ("resnet50", "mobilenet_v3_small", "timm/resnet18")
#: the compile cell's models that also train on at other compressions, counting recompiles
RECOMPILE_MODELS = ("timm/resnet18",)
#: the models the ``ladder_in_trainer`` cell runs on (a ``fit`` of 15-25 steps each): a ResNet
#: (the continuum on the top rung), a MobileNet and a timm RegNet (on rung 0)
LADDER_MODELS = ("resnet18", "vgg11_bn", "densenet121", "mobilenet_v3_small", "timm/regnetx_002")


def logits(out: Any) -> torch.Tensor:
    """The logits of a model's output (Inception's and GoogLeNet's named tuples included)."""
    return out.logits if hasattr(out, "logits") else out


def forward_backward(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, meter: SavedTensorMeter | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded training forward (dropout, stochastic depth) and backward; returns (logits, loss)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    if meter is None:
        out = logits(model(x))
    else:
        with meter:
            out = logits(model(x))
    loss = F.cross_entropy(out.float(), y)
    loss.backward()
    return out.detach(), loss.detach()


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` (Frobenius norms), 0 for two zero tensors."""
    a, b = a.double(), b.double()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


def assert_close(name: str, a: torch.Tensor, b: torch.Tensor, rtol: float) -> None:
    err = rel_err(a, b)
    assert err <= rtol, f"{name}: relative error {err:.3g} > {rtol:g}"


def assert_grads_close(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float, what: str
) -> float:
    """Each gradient within ``rtol`` of ``want``'s, relative to the norm of all gradients
    (:data:`FLOOR`: tiny gradients, such as a convolution's bias before a training-mode
    BatchNorm, are zero up to round-off); returns the worst error."""
    missing = sorted(got.keys() ^ want.keys())
    assert not missing, f"{what}: parameters with gradients differ: {missing[:5]}"
    total = math.sqrt(sum(g.double().norm().item() ** 2 for g in want.values()))
    worst = 0.0
    for n in want:
        den = max(want[n].double().norm().item(), FLOOR * total)
        err = (got[n].double() - want[n].double()).norm().item() / den if den > 0 else 0.0
        worst = max(worst, err)
        assert err <= rtol, f"{what}: gradient of {n}: relative error {err:.3g} > {rtol:g}"
    return worst


def assert_finite(model: nn.Module, loss: torch.Tensor) -> None:
    assert torch.isfinite(loss).all(), f"loss {loss}"
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients: {bad[:5]}"
    assert any(p.grad is not None for p in model.parameters()), "no gradients"


#: the relative tolerances per precision: float32 first; a float32 miss is checked again in
#: float64 (batch-2 BatchNorm amplifies float32 round-off far beyond 1e-5 in deep models)
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-7}


def roundoff_rtol(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, reference: dict[str, torch.Tensor], rtol: float
) -> float:
    """``rtol``, or 10 times how far the gradients move when the input moves by a few units of
    round-off, whichever is larger. Two exact computations of one gradient by different ops (a
    checkpointed unit saves and rebuilds other tensors than the plain one) differ by round-off,
    which an ill-conditioned model amplifies: ResNet-50's batch-2 BatchNorm over 1x1 maps turns
    a 1e-15 change of the input into 1e-5 of its gradients. A wrong gradient moves them by
    orders of magnitude more."""
    eps = 8 * torch.finfo(x.dtype).eps
    forward_backward(model, x * (1 + eps), y)
    moved = assert_grads_close(grads(model), reference, math.inf, "input moved by round-off")
    return max(rtol, 10 * moved)


def in_float32_else_float64(check: Any, *, rtol64: float | None = None) -> dict[str, Any]:
    """Run ``check(dtype, rtol)`` in float32; if it fails, again in float64 (whose failure stands)."""
    try:
        result = check(torch.float32, TOLERANCES[torch.float32])
        return {**result, "dtype": "float32"}
    except AssertionError as error:
        first = str(error)
    result = check(torch.float64, rtol64 if rtol64 is not None else TOLERANCES[torch.float64])
    return {**result, "dtype": "float64", "float32": first}


# -- cells -------------------------------------------------------------------------------------


def c0_equals_plain(name: str) -> dict[str, Any]:
    """``bandlimit(model, 0.0)``: the same outputs and gradients as the untouched model."""

    def check(dtype: torch.dtype, rtol: float) -> dict[str, Any]:
        plain = build(name, dtype)
        limited = bandlimit(copy.deepcopy(plain), 0.0)
        x, y = batch(name, dtype=dtype)
        out_p, _ = forward_backward(plain, x, y)
        out_b, _ = forward_backward(limited, x, y)
        assert_close("logits", out_b, out_p, rtol)
        return {"worst_grad_rel_err": assert_grads_close(grads(limited), grads(plain), rtol, "c=0 vs plain")}

    return in_float32_else_float64(check)


def c05_step(name: str) -> dict[str, Any]:
    """``bandlimit(model, 0.5)`` and one SGD step: finite loss and gradients, parameters move."""
    model = bandlimit(build(name), 0.5)
    x, y = batch(name)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    _, loss = forward_backward(model, x, y)
    assert_finite(model, loss)
    optimizer.step()
    moved = sum(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert moved > 0, "no parameter moved"
    assert all(torch.isfinite(p).all() for p in model.parameters()), "non-finite parameters after the step"
    return {"loss": loss.item()}


def rungs_exact(name: str, compression: float) -> dict[str, Any]:
    """Every rung (the units of the first ``r`` stages checkpointed) gives the gradients of no
    checkpointing; at least 2 rungs; the top rung keeps fewer bytes for backward than rung 0."""
    return in_float32_else_float64(lambda dtype, rtol: _rungs_exact(name, compression, dtype, rtol))


def _rungs_exact(name: str, compression: float, dtype: torch.dtype, rtol: float) -> dict[str, Any]:
    model = bandlimit(build(name, dtype), compression)
    x, y = batch(name, dtype=dtype)
    stages = CheckpointRungs(checkpoint_units(model))
    with stages.profile(exclude=model.parameters()) as profile:  # rung 0: nothing checkpointed
        _, loss = forward_backward(model, x, y)
    assert torch.isfinite(loss), f"rung 0: loss {loss}"
    stages.set_stages(profile.stages())
    top = len(stages.stages or [])
    assert top >= 2, f"only {top} exact rung(s); stages {stages.stages}"
    kept = [profile.meter.bytes]
    reference = grads(model)
    rtol = roundoff_rtol(model, x, y, reference, rtol)
    worst = 0.0
    for rung in range(1, top + 1):
        stages.apply(rung)
        meter = SavedTensorMeter(exclude=model.parameters())
        _, loss = forward_backward(model, x, y, meter)
        assert torch.isfinite(loss), f"rung {rung}: loss {loss}"
        kept.append(meter.bytes)
        worst = max(worst, assert_grads_close(grads(model), reference, rtol, f"rung {rung} vs rung 0"))
    stages.apply(0)
    assert kept[-1] < kept[0], f"top rung keeps {kept[-1]} bytes for backward, rung 0 {kept[0]}"
    return {"rungs": top, "bytes": kept, "worst_grad_rel_err": worst}


def rungs_exact_c0(name: str) -> dict[str, Any]:
    return rungs_exact(name, 0.0)


def rungs_exact_c05(name: str) -> dict[str, Any]:
    return rungs_exact(name, 0.5)


def cost_rungs_exact(name: str) -> dict[str, Any]:
    """Every rung of the cost order (:meth:`UnitProfile.plan`: pointwise modes, then full ones,
    cheapest bytes first) gives the gradients of no checkpointing at c=0; the top rung has every
    unit in full; the rungs keep no more bytes for backward as they climb, but for round-off."""
    return in_float32_else_float64(lambda dtype, rtol: _cost_rungs_exact(name, dtype, rtol))


def _cost_rungs_exact(name: str, dtype: torch.dtype, rtol: float) -> dict[str, Any]:
    model = bandlimit(build(name, dtype), 0.0)
    x, y = batch(name, dtype=dtype)
    stages = CheckpointRungs(checkpoint_units(model))
    with stages.profile(exclude=model.parameters(), record=2) as profile:
        forward_backward(model, x, y)
    # as the callback does: a unit whose pointwise mode is not exact on its samples keeps only
    # its full mode (e.g. a convolution's saved output that an in-place activation then changes)
    no_pointwise = [
        n
        for n, args in profile.inputs.items()
        if trial(n, stages.units[n], args, mode="pointwise") is not None
    ]
    profile.inputs.clear()
    plan = profile.plan(no_pointwise=no_pointwise)
    stages.set_stages(plan.rungs)
    reference = grads(model)
    rtol = roundoff_rtol(model, x, y, reference, rtol)
    kept, worst = [profile.meter.bytes], 0.0
    for rung in range(1, len(plan.rungs) + 1):
        stages.apply(rung)
        meter = SavedTensorMeter(exclude=model.parameters())
        _, loss = forward_backward(model, x, y, meter)
        assert torch.isfinite(loss), f"rung {rung}: loss {loss}"
        kept.append(meter.bytes)
        worst = max(worst, assert_grads_close(grads(model), reference, rtol, f"cost rung {rung} vs rung 0"))
    assert set(stages.modes_at(len(plan.rungs)).values()) == {"full"}
    assert len(stages.modes_at(len(plan.rungs))) == len(stages.units)
    stages.apply(0)
    assert kept[-1] < kept[0], f"top rung keeps {kept[-1]} bytes for backward, rung 0 {kept[0]}"
    pointwise = sum(move.startswith("pointwise:") for rung in plan.rungs for move in rung)
    return {
        "rungs": len(plan.rungs),
        "pointwise_moves": pointwise,
        "no_pointwise": len(no_pointwise),
        "bytes": kept,
        "worst_grad_rel_err": worst,
    }


def step_squeeze(name: str) -> dict[str, Any]:
    """A co-tenant takes its memory within one check, leaving the job short of ``min_free`` by
    half of what the exact rungs free: the ladder absorbs it with exact rungs in one decision,
    never compresses, and is never over budget or short of ``min_free`` afterwards. A simulated
    device (free = total - co-tenant - the job's measured memory: bytes saved for backward at
    the rung it runs on) drives the controller
    :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` uses, with its defaults."""
    model = bandlimit(build(name), 0.0)
    x, y = batch(name)
    stages = CheckpointRungs(checkpoint_units(model))
    with stages.profile(exclude=model.parameters()) as profile:
        forward_backward(model, x, y)
    stages.set_stages(profile.stages())
    top = len(stages.stages or [])
    memory: dict[int, int] = {0: profile.meter.bytes}

    def job(setting: Setting) -> int:
        assert setting.compression == 0, f"compressed to {setting.compression} on rung {setting.rung}"
        if setting.rung not in memory:
            stages.apply(setting.rung)
            meter = SavedTensorMeter(exclude=model.parameters())
            forward_backward(model, x, y, meter)
            memory[setting.rung] = meter.bytes
        return memory[setting.rung]

    freed = memory[0] - job(Setting(top, 0.0))
    assert freed > 0, f"the top rung frees nothing: {memory}"
    min_free = freed  # so a squeeze smaller than what the exact rungs free is never over budget
    ladder = LadderController(rungs=top, min_free=min_free, release_free=2 * min_free, max_compression=0.9)
    ladder.on_stages_measured(profile.savings())
    total = memory[0] + min_free + freed // 20  # calm: free just above min_free
    squeeze = freed // 20 + 45 * freed // 100  # leaves the job 45 % of what the exact rungs free short
    cotenant = [0] * 3 + [squeeze] * 10
    settings, frees, _ = simulate_device(ladder, cotenant, job, total, Setting(0, 0.0))
    stages.apply(0)
    assert min(frees) >= 0, f"over budget: free {frees}, settings {settings}"
    assert settings[4].rung > 0, f"the squeeze was not absorbed in one decision: {settings}"
    assert min(frees[4:]) >= min_free, f"short of min_free after the squeeze: {frees}"
    return {
        "rungs": top,
        "freed_by_top": freed,
        "squeeze": squeeze,
        "max_rung": max(s.rung for s in settings),
    }


def bf16(name: str) -> dict[str, Any]:
    """bfloat16 autocast forward and backward at c=0.5: finite."""
    model = bandlimit(build(name), 0.5)
    x, y = batch(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = forward_backward(model, x, y)
    assert_finite(model, loss)
    return {"loss": loss.item()}


def channels_last(name: str) -> dict[str, Any]:
    """Channels-last model and input at c=0.5: the outputs and gradients of the contiguous run
    (BatchNorm and dropout frozen: see :func:`frozen_batchnorm`)."""
    return in_float32_else_float64(lambda dtype, _: _channels_last(name, dtype), rtol64=1e-4)


def _channels_last(name: str, dtype: torch.dtype, rtol: float = 1e-4) -> dict[str, Any]:
    x, y = batch(name, dtype=dtype)
    ref = frozen_batchnorm(bandlimit(build(name, dtype), 0.5))
    model = frozen_batchnorm(bandlimit(build(name, dtype), 0.5)).to(memory_format=torch.channels_last)
    out_r, _ = forward_backward(ref, x, y)
    out_c, loss_c = forward_backward(model, x.to(memory_format=torch.channels_last), y)
    assert_finite(model, loss_c)
    assert_close("logits", out_c, out_r, rtol)
    worst = assert_grads_close(grads(model), grads(ref), rtol, "channels_last vs contiguous")
    return {"worst_grad_rel_err": worst}


def frozen_batchnorm(model: nn.Module) -> nn.Module:
    """BatchNorm and dropout layers in eval mode, the rest in training mode.

    Training-mode BatchNorm over a batch of 2 at the last stages' 1x1 maps normalises two
    numbers to +-1: its gradient grows as their difference shrinks, and the same torch model
    in channels-last and contiguous format differs by up to 60% in float64 (torchvision
    ``regnet_x_400mf``, no band-limiting). Dropout on a feature map draws its mask in memory
    order, so the same seed drops other pixels in channels-last format (SqueezeNet at 64x64).
    Comparisons across memory formats freeze both."""
    for module in model.modules():
        if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)):
            module.eval()
    return model


def compile_step(name: str) -> dict[str, Any]:
    """``torch.compile(backend="aot_eager")`` of the c=0.5 model: eval outputs close to eager,
    and one training step runs; on :data:`RECOMPILE_MODELS`, training on at other compressions
    (0.3, 0.7, 0.5, 0) costs at most one recompile per compression level visited."""
    import torch._dynamo

    torch._dynamo.reset()
    try:
        return _compile_step(name)
    finally:
        torch._dynamo.reset()  # the compiled graphs and their cache go with the test


def _compile_step(name: str) -> dict[str, Any]:
    import torch._dynamo.testing

    eager = bandlimit(build(name), 0.5)
    model = copy.deepcopy(eager)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    x, y = batch(name)
    eager.eval(), compiled.eval()
    with torch.no_grad():
        want = logits(eager(x))
        got = logits(compiled(x))
    assert_close("eval logits", got, want, 1e-4)
    compiled.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    _, loss = forward_backward(compiled, x, y)
    assert_finite(model, loss)
    optimizer.step()
    first = counter.frame_count
    levels = (0.3, 0.7, 0.5, 0.0) if name in RECOMPILE_MODELS else ()
    for compression in levels:
        set_compression(model, compression)
        optimizer.zero_grad()
        _, loss = forward_backward(compiled, x, y)
        assert_finite(model, loss)
        optimizer.step()
    recompiles = counter.frame_count - first
    assert recompiles <= len(set(levels)), f"{recompiles} recompiles over compressions {levels}"
    return {"loss": loss.item(), "recompiles": recompiles if levels else None}


# -- the micro-batch split ---------------------------------------------------------------------

#: the split cell: a batch of this many samples, whole and in :data:`SPLIT_CHUNKS` chunks, float64
SPLIT_BATCH = 4
SPLIT_CHUNKS = 2
#: the largest relative difference of the split's gradient from the whole batch's (float64)
SPLIT_RTOL = 1e-12
#: the class names of layers that draw random numbers in training mode (a chunk draws other
#: numbers than its part of the whole batch does): put in eval mode for the train-mode comparison
RANDOM_LAYERS = ("Dropout", "DropPath", "DropBlock", "StochasticDepth")


def split(name: str) -> dict[str, Any]:
    """The micro-batch split (``lightning_bandlimit.microbatch``): a batch of
    :data:`SPLIT_BATCH` in :data:`SPLIT_CHUNKS` chunks, float64, a per-sample-mean cross-entropy.

    * ``difference``: :func:`~lightning_bandlimit.microbatch.split_trial` on a minimal
      LightningModule (the product's judgement, in eval mode): exact, within :data:`SPLIT_RTOL`,
      on every model.
    * ``train_difference``: the same comparison in training mode. Without BatchNorm (GroupNorm
      and LayerNorm are per sample) the whole model in training mode, the chunks from
      :func:`~lightning_bandlimit.microbatch.split_batch`, the random layers in eval mode
      (:func:`random_layers_frozen`: a chunk would draw other dropout masks than its part of the
      whole batch does, whatever the seed): within :data:`SPLIT_RTOL`. With BatchNorm each chunk
      is normalised by its own statistics (ghost batches): ``split_trial``'s
      ``batch_norm_difference`` (BatchNorm in training mode, dropout off), recorded, not judged;
      the model then must still be exact in eval mode (``difference``).
    """
    import lightning.pytorch as pl

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build(name, torch.float64)

        def training_step(self, batch_: Any, _: int) -> torch.Tensor:
            x, y = batch_
            return F.cross_entropy(logits(self.model(x)), y)

    module = Classifier()
    batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
    data = batch(name, n=SPLIT_BATCH, dtype=torch.float64)
    trial = split_trial(module, data, 0, split=SPLIT_CHUNKS)
    assert trial.exact, f"split_trial: {trial.reason}"
    assert trial.difference <= SPLIT_RTOL, (
        f"eval mode: the split's gradient differs from the whole batch's by {trial.difference:.3g} "
        f"(relative) > {SPLIT_RTOL:g}"
    )
    assert (trial.batch_norm_difference is not None) == batch_norm, (
        f"split_trial's batch_norm_difference {trial.batch_norm_difference} on a model "
        f"{'with' if batch_norm else 'without'} BatchNorm"
    )
    if batch_norm:  # BatchNorm alone in training mode (dropout off): ghost batches, recorded
        train_difference, frozen = trial.batch_norm_difference, None
    else:
        frozen = random_layers_frozen(module.train())
        train_difference = split_difference(module, data, SPLIT_CHUNKS)
        assert train_difference <= SPLIT_RTOL, (
            f"train mode, no BatchNorm: the split's gradient differs from the whole batch's by "
            f"{train_difference:.3g} (relative) > {SPLIT_RTOL:g}"
        )
    return {
        "difference": trial.difference,
        "batch_norm": batch_norm,
        "train_difference": train_difference,
        "frozen_random_layers": frozen,
    }


def random_layers_frozen(model: nn.Module) -> int:
    """The layers that draw random numbers in training mode in eval mode (their class name has
    one of :data:`RANDOM_LAYERS`: torch's dropout, torchvision's ``StochasticDepth``, timm's
    ``DropPath`` and ``DropBlock2d``; and a module with a ``drop_rate > 0``: timm's classifiers'
    functional dropout, e.g. GhostNet's, that module alone); returns how many of them drop
    anything (a rate above 0, or none found)."""
    dropping = 0
    for module in _random_layers(model):
        rate = next(iter(_drop_rates(module).values()), None)
        module.training = False  # this module alone (a timm model's children stay in training)
        dropping += rate is None or rate > 0
    return dropping


def _random_layers(model: nn.Module) -> Iterator[nn.Module]:
    """The modules that draw random numbers in training mode (see :func:`random_layers_frozen`)."""
    for module in model.modules():
        named = any(word in type(module).__name__ for word in RANDOM_LAYERS)
        if named or (getattr(module, "drop_rate", 0) or 0) > 0:
            yield module


def _drop_rates(module: nn.Module) -> dict[str, float]:
    """``module``'s rate attributes (``p``, ``drop_prob``, ``drop_rate``) that are numbers, in that order."""
    rates = {}
    for attribute in ("p", "drop_prob", "drop_rate"):
        value = getattr(module, attribute, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rates[attribute] = float(value)
    return rates


def split_difference(module: nn.Module, data: Any, chunks: int) -> float:
    """``||g_split - g_whole|| / ||g_whole||`` of ``module.training_step``'s gradient, the chunks'
    losses weighted by their share of the batch, in the modules' current modes."""
    params = [p for p in module.parameters() if p.requires_grad]

    def gradient(pieces: list[tuple[Any, float]]) -> list[torch.Tensor]:
        total = [torch.zeros_like(p) for p in params]
        for piece, weight in pieces:
            loss = module.training_step(piece, 0)  # type: ignore[operator]
            found = torch.autograd.grad(loss * weight, params, allow_unused=True)
            total = [t if g is None else t + g for t, g in zip(total, found)]
        return total

    whole = gradient([(data, 1.0)])
    parts = split_batch(data, chunks)
    assert len(parts) == chunks, f"{len(parts)} chunks of a batch of {SPLIT_BATCH}"
    size = sum(count for _, count in parts)
    chunked = gradient([(part, count / size) for part, count in parts])
    norm = math.sqrt(sum(g.double().norm().item() ** 2 for g in whole))
    error = math.sqrt(sum((a - b).double().norm().item() ** 2 for a, b in zip(chunked, whole)))
    assert norm > 0, "the whole batch's gradient is zero"
    return error / norm


# -- the ladder in a Trainer -------------------------------------------------------------------

M = 1_000_000
TOTAL = 100 * M
MIN_FREE, RELEASE_FREE = 20 * M, 40 * M


CALM = 5  # calm reads first: the profiling step, then rung 0 measured


class LadderTrace:
    """A scripted free-memory trace that walks the ladder through every rung: calm; pressure,
    one byte short of ``min_free``, until the top rung (the co-tenant takes what each rung frees,
    so the ladder climbs one measured rung a check); then no free memory at all, which only the
    compression can meet; then plenty of room until rung 0 at the floor."""

    def __init__(self) -> None:
        self.callback: Any = None
        self.phase = "up"
        self.pressure_next = False  # the first read after the calm ones holds at MIN_FREE

    def __call__(self, i: int) -> int:
        cb = self.callback
        if i < CALM:
            return (MIN_FREE + RELEASE_FREE) // 2  # calm: the profiling step and rung 0's time
        if self.phase == "up" and cb.controller.top > 0 and cb.setting.rung == cb.controller.top:
            self.phase = "lossy"
        if self.phase == "lossy" and cb.compression > 0:
            self.phase = "back"
        if self.phase == "up":
            self.pressure_next = not self.pressure_next
            return MIN_FREE if self.pressure_next else MIN_FREE - 1
        return 0 if self.phase == "lossy" else TOTAL

    @property
    def released(self) -> bool:
        return self.phase == "back"


def ladder_in_trainer(name: str, max_steps: int = 80) -> dict[str, Any]:
    """``AdaptiveBandLimit`` in a ``Trainer`` driven by :class:`LadderTrace`: every rung
    visited, the compression raised above 0 and given back to rung 0 at 0, finite loss."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_bandlimit.callbacks import AdaptiveBandLimit
    from lightning_bandlimit.memory import ScriptedProbe

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build(name)
            self.losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return logits(self.model(x))

        def training_step(self, batch_: Any, _: int) -> torch.Tensor:
            x, y = batch_
            loss = F.cross_entropy(self(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class StopWhenBack(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            d = callback.decisions
            if trace.released and d and d[-1]["rung"] == 0 and d[-1]["compression"] == 0:
                trainer.should_stop = True

    x, y = batch(name, n=32)
    loader = DataLoader(TensorDataset(x, y), batch_size=2, shuffle=False)
    trace = LadderTrace()
    thresholds = {"min_free": MIN_FREE, "release_free": RELEASE_FREE}
    callback = AdaptiveBandLimit(  # the rungs, then the compression (batch 2: nothing to split)
        probe=ScriptedProbe(trace, total=TOTAL),
        levers=("checkpoint", "compression"),
        **{**SCRIPTED_ADAPTIVE, **thresholds},
    )
    trace.callback = callback
    module = Classifier()
    trainer = cpu_trainer([callback, StopWhenBack()], max_steps=max_steps, max_epochs=-1, limit_val_batches=0)
    trainer.fit(module, loader)
    decisions = callback.decisions
    top = callback.controller.rungs
    rungs = [d["rung"] for d in decisions]
    compressions = [d["compression"] for d in decisions]
    assert top >= 1, f"no exact rungs (controller.rungs={top})"
    assert set(range(top + 1)) <= set(rungs), f"rungs visited {sorted(set(rungs))} of 0..{top}: {rungs}"
    assert max(compressions) > 0, f"compression never rose: {compressions}"
    first_lossy = next(i for i, c in enumerate(compressions) if c > 0)
    assert max(rungs[:first_lossy]) == top, "the compression rose before the top rung"
    assert set(range(top + 1)) <= set(rungs[:first_lossy]), "the compression rose before every rung"
    assert rungs[-1] == 0 and compressions[-1] == 0, (
        f"not back at rung 0, c=0: {list(zip(rungs, compressions))[-5:]}"
    )
    assert module.losses and all(math.isfinite(v) for v in module.losses), f"losses {module.losses}"
    return {"rungs": top, "steps": len(decisions), "max_compression": max(compressions)}


#: the models the ``trainer_exact`` cell runs on in the suite (a float64 fit with a twin each
#: step, 30-45 s on one core): a BatchNorm ResNet (no exact split: ghost batches, off by default)
#: and a model without BatchNorm whose split is exact (ConvNeXt's LayerNorm; VGG-11's 42 s, 93 s
#: beside four workers, is left to the benchmark);
#: ``python -m benchmarks.zoo.zoo_matrix --all-cells --cells trainer_exact`` runs it on every model
TRAINER_EXACT_MODELS = ("resnet18", "timm/convnext_atto")
#: the largest difference of a step's gradient from the twin's, relative to the twin's norm, on
#: a step the ladder calls exact (float64)
TRAINER_EXACT_RTOL = 1e-9


def random_layers_off(model: nn.Module) -> int:
    """The rate of every layer that draws random numbers in training mode (see
    :func:`random_layers_frozen`) set to 0, so that it stays off whatever mode a ``Trainer``
    puts it in; returns how many were dropping anything."""
    dropping = 0
    for module in _random_layers(model):
        for attribute, rate in _drop_rates(module).items():
            dropping += rate > 0
            setattr(module, attribute, 0.0)
    return dropping


def trainer_exact(name: str, max_steps: int = 80) -> dict[str, Any]:
    """Every move the ladder calls exact is exact as the model trains (issue 69): the model in
    float64 (random layers off, :func:`random_layers_off`), ``AdaptiveBandLimit`` with its
    default levers, rung order and ``ghost_batch`` in a ``Trainer`` (batch 8), driven by
    :class:`LadderTrace` past every rung to the compression and back. At every step a twin (the
    same weights and compression, nothing checkpointed, the whole batch) computes the step's
    gradient: on every step whose decision says ``"exact"`` (rungs, an exact split) the
    ``Trainer``'s gradient is the twin's to :data:`TRAINER_EXACT_RTOL`; every setting before the
    first lossy one is exact (no ghost-batch split where the user did not ask for one: batch 8
    has no chunk of 32); the top rung is reached before the compression rises."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_bandlimit.callbacks import AdaptiveBandLimit
    from lightning_bandlimit.memory import ScriptedProbe
    from lightning_bandlimit.recompute.switch import is_checkpointed, uncheckpoint

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build(name, torch.float64)
            self.dropping = random_layers_off(self.model)

        def training_step(self, batch_: Any, _: int) -> torch.Tensor:
            x, y = batch_
            return F.cross_entropy(logits(self.model(x)), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Twin(pl.Callback):
        """The step's gradient against a plain twin's on the whole batch."""

        def __init__(self) -> None:
            self.batch: Any = None
            self.errors: list[float] = []

        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch_: Any, *args: Any) -> None:
            self.batch = batch_

        def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
            got = {
                n: p.grad.detach().clone()
                for n, p in pl_module.model.named_parameters()
                if p.grad is not None
            }
            twin = copy.deepcopy(pl_module.model)
            for module in twin.modules():
                if is_checkpointed(module):
                    uncheckpoint(module)
            x, y = self.batch
            twin.zero_grad(set_to_none=True)
            F.cross_entropy(logits(twin(x)), y).backward()
            want = {n: p.grad for n, p in twin.named_parameters() if p.grad is not None}
            assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())[:5]
            num = math.sqrt(sum((got[n] - want[n]).double().square().sum().item() for n in want))
            den = math.sqrt(sum(want[n].double().square().sum().item() for n in want))
            self.errors.append(num / den if den > 0 else num)

    class StopWhenBack(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            d = callback.decisions
            if (
                trace.released
                and d
                and d[-1]["rung"] == 0
                and d[-1]["compression"] == 0
                and d[-1]["split"] == 1
            ):
                trainer.should_stop = True

    x, y = batch(name, n=64, dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
    trace = LadderTrace()
    callback = AdaptiveBandLimit(
        probe=ScriptedProbe(trace, total=TOTAL),
        min_free=MIN_FREE,
        release_free=RELEASE_FREE,
        check_every_n_steps=1,
    )
    trace.callback = callback
    twin = Twin()
    trainer = cpu_trainer(
        [callback, twin, StopWhenBack()], max_steps=max_steps, max_epochs=-1, limit_val_batches=0
    )
    trainer.fit(Classifier(), loader)
    decisions = callback.decisions
    # a decision at step s is the setting the steps after it ran at: step s + 1's gradient
    ran = [("exact", 0, 1)] + [(d["exactness"], d["rung"], d["split"]) for d in decisions]
    steps = list(zip(ran, twin.errors))
    assert len(twin.errors) == len(decisions) >= 2, (len(twin.errors), len(decisions))
    exactness = [e for e, _, _ in ran]
    first_lossy = exactness.index("lossy") if "lossy" in exactness else len(exactness)
    assert set(exactness[:first_lossy]) == {"exact"}, f"before the first lossy move: {ran[:first_lossy]}"
    top = callback.controller.rungs
    assert top >= 1 and max(r for _, r, _ in ran[:first_lossy]) == top, (
        f"the top rung {top} not reached: {ran}"
    )
    worst = 0.0
    for (kind, rung, split_), error in steps:
        if kind == "exact":
            assert error <= TRAINER_EXACT_RTOL, (
                f"an exact step (rung {rung}, split {split_}) is {error:.3g} from the whole batch's gradient "
                f"(relative) > {TRAINER_EXACT_RTOL:g}"
            )
            worst = max(worst, error)
    outcome = callback._splits.outcome if callback._splits is not None else None
    return {
        "rungs": top,
        "steps": len(decisions),
        "max_split": max(s for _, _, s in ran),
        "split_lever": None
        if outcome is None
        else ("ghost" if outcome.ghost else "exact")
        if outcome.splits
        else "off",
        "worst_exact_rel_err": worst,
        "lossy_steps": exactness.count("lossy"),
    }


CELL_FUNCTIONS = {
    "c0_equals_plain": c0_equals_plain,
    "c05_step": c05_step,
    "rungs_exact_c0": rungs_exact_c0,
    "rungs_exact_c05": rungs_exact_c05,
    "cost_rungs_exact": cost_rungs_exact,
    "step_squeeze": step_squeeze,
    "ladder_in_trainer": ladder_in_trainer,
    "bf16": bf16,
    "channels_last": channels_last,
    "compile": compile_step,
    "split": split,
    "trainer_exact": trainer_exact,
}


def applicable(name: str, cell: str) -> bool:
    """Whether the cell runs on the model (``compile`` and ``ladder_in_trainer`` on a few)."""
    if cell == "compile":
        return name in COMPILE_MODELS
    if cell == "trainer_exact":
        return name in TRAINER_EXACT_MODELS
    return cell != "ladder_in_trainer" or name in LADDER_MODELS


def cells_for(names: Iterable[str]) -> list[tuple[str, str]]:
    """The ``(model, cell)`` pairs to run, in model order."""
    return [(n, c) for n in names for c in CELLS if applicable(n, c)]


__all__ = [
    "CELLS",
    "CELL_FUNCTIONS",
    "COMPILE_MODELS",
    "RECOMPILE_MODELS",
    "LADDER_MODELS",
    "SPLIT_RTOL",
    "applicable",
    "cells_for",
]
