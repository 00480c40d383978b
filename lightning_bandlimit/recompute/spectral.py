"""Checkpointed blocks that keep their input as the kept spectrum their band-limited convolutions read.

Ordinary checkpointing keeps a block's input at full size and recomputes the block from it in
backward. When the input reaches the block's arithmetic only through

* band-limited convolutions (memory-lean, at a band that drops coefficients), which read only
  its kept spectrum,
* 1x1 zero-padded strided convolutions (a ResNet downsampling shortcut), which read only the
  pixels on their stride grid, and
* identity shortcuts added to the block's result (``out + x``, ``out += x``, ``nn.Identity``),
  whose backward needs nothing,

the block keeps exactly what those readers read (each band-limited convolution's kept input
spectrum, each strided shortcut's pixels) and recomputes everything else from it in backward:
the **region** of the block that depends on its input only through the readers runs under
``torch.utils.checkpoint`` (non-reentrant, DDP-safe) with those tensors as its inputs; the
rest, the residual sum and what follows it, runs as usual (a memory-lean ReLU after the sum keeps
its bit mask). The same operations run on the same values, so outputs and gradients equal those
of the band-limited model without checkpointing (to round-off; a band-limited convolution's
output is computed by its spectral algorithm here, whatever ``algorithm`` it would choose).
BatchNorm running statistics are restored after the recompute by the caller's ``context_fn``.

Which blocks qualify is found by tracing the block's ``forward`` once with ``torch.fx`` (modules
without children are leaves) and checked again at every training forward against the live
modules: a ResNet basic block (torchvision's ``BasicBlock``, this package's CIFAR block) at any
compression where what its readers keep, together, is smaller than the block's input. Bottleneck blocks and
MobileNet's inverted residuals open with a 1x1 convolution that reads every pixel (1x1
convolutions are not band-limited by default) and fall back to ordinary checkpointing;
:func:`spectral_fallback` says why, per block.
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint
from torch import fx, nn

from lightning_bandlimit.functional.lean.conv import conv_dtype, conv_function, stride_grid
from lightning_bandlimit.functional.lean.regions import checkpointed_region, keeping_spectra
from lightning_bandlimit.functional.spectrum_split import (
    analyse,
    conv_from_spectrum,
    input_plan,
    spectrum_bytes,
)
from lightning_bandlimit.layers.band_limited import BandLimitedConvNd

__all__ = ["BlockPlan", "block_plan", "can_keep_spectrum", "checkpoint_from_spectrum", "spectral_fallback"]

_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)
_ADD_METHODS = ("add", "add_")
_CONVS = (nn.Conv1d, nn.Conv2d)


class _Tracer(fx.Tracer):
    """Modules without children are leaves (this package's layers subclass ``torch.nn`` ones)."""

    def __init__(self, traced_func_name: str) -> None:
        super().__init__()
        self.traced_func_name = traced_func_name

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return next(m.children(), None) is None or super().is_leaf_module(m, module_qualified_name)


@dataclass(frozen=True, eq=False)
class BlockPlan:
    """How a block's forward splits around its input (see the module docstring).

    Attributes:
        reason: why the block's structure cannot keep a spectrum (``None``: it can, if its
            readers qualify at run time).
        input: the block's input (the trace's placeholder).
        readers: the convolution calls that read the input.
        region: the nodes recomputed in backward (graph order).
        outputs: the region's values used after it.
        outside: the nodes run as usual after the region (graph order, the output node last).
    """

    reason: str | None
    input: fx.Node | None = None
    readers: tuple[fx.Node, ...] = ()
    region: tuple[fx.Node, ...] = ()
    outputs: tuple[fx.Node, ...] = ()
    outside: tuple[fx.Node, ...] = ()


_PLANS: weakref.WeakKeyDictionary[nn.Module, BlockPlan] = weakref.WeakKeyDictionary()
_FALLBACKS: weakref.WeakKeyDictionary[nn.Module, str | None] = weakref.WeakKeyDictionary()


def _is_add(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in _ADD_FUNCTIONS
    return node.op == "call_method" and node.target in _ADD_METHODS


def _describe(module: nn.Module, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"the call of {str(node.target)!r} ({type(module.get_submodule(str(node.target))).__name__})"
    name = getattr(node.target, "__name__", str(node.target))
    return f"{'method' if node.op == 'call_method' else 'function'} {name!r}"


def _trace(module: nn.Module, forward_name: str) -> fx.Graph | str:
    try:
        return _Tracer(forward_name).trace(module)
    except Exception as err:  # torch.fx raises many kinds (data-dependent control flow, ...)
        first_line = str(err).splitlines()[0] if str(err) else ""
        return f"torch.fx cannot trace its forward ({type(err).__name__}: {first_line})"


def _split(module: nn.Module, graph: fx.Graph) -> BlockPlan:
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        return BlockPlan(f"its forward takes {len(placeholders)} inputs, not one")
    x = placeholders[0]
    aliases = [x]  # the input itself and nn.Identity applied to it
    readers: list[fx.Node] = []
    sums: list[fx.Node] = []
    for alias in aliases:
        for user in alias.users:
            if user.op == "call_module" and isinstance(module.get_submodule(str(user.target)), nn.Identity):
                aliases.append(user)
            elif user.op == "call_module" and isinstance(module.get_submodule(str(user.target)), _CONVS):
                if user.args[1:] or user.kwargs:
                    return BlockPlan(f"{user.target} is called with more than the block's input")
                readers.append(user)
            elif _is_add(user) and not user.kwargs and len(user.args) == 2:
                sums.append(user)
            elif user.op == "output":
                return BlockPlan("it returns its input")
            else:
                return BlockPlan(f"its input reaches {_describe(module, user)} directly")
    if not readers:
        return BlockPlan("no convolution reads its input")
    outside: set[fx.Node] = set(aliases[1:]) | set(sums)
    for node in graph.nodes:  # graph order: every input of a node comes before it
        if node not in outside and node not in readers and any(a in outside for a in node.all_input_nodes):
            outside.add(node)
        elif node.op == "output":
            outside.add(node)
    region = [n for n in graph.nodes if n.op != "placeholder" and n not in outside]
    outputs = [n for n in region if any(u in outside for u in n.users)]
    return BlockPlan(
        None,
        x,
        tuple(readers),
        tuple(region),
        tuple(outputs),
        tuple(n for n in graph.nodes if n in outside),
    )


def block_plan(module: nn.Module) -> BlockPlan:
    """The traced split of ``module``'s forward (cached per module object).

    Args:
        module: a block, checkpointed or not.

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> block = cifar_resnet18(width=8)[5]  # the first block of the second stage
        >>> plan = block_plan(block)
        >>> plan.reason, [n.target for n in plan.readers]
        (None, ['conv1', 'shortcut.0'])
        >>> block_plan(nn.Sequential(nn.ReLU(), nn.Conv2d(1, 1, 3))).reason
        "its input reaches the call of '0' (ReLU) directly"
    """
    plan = _PLANS.get(module)
    if plan is None:
        forward_name = "_unchecked_forward" if hasattr(type(module), "_unchecked_forward") else "forward"
        graph = _trace(module, forward_name)
        plan = BlockPlan(graph) if isinstance(graph, str) else _split(module, graph)
        _PLANS[module] = plan
    return plan


def can_keep_spectrum(module: nn.Module) -> bool:
    """Whether ``module``, checkpointed, keeps a kept spectrum at a band-limiting compression.

    True when its structure qualifies and its input is read by at least one memory-lean
    band-limited convolution (any compression: a full band or a map too small for its spectrum
    to be the smaller form still fall back, per forward).

    Example:
        >>> from lightning_bandlimit import bandlimit
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> model = cifar_resnet18(width=4)
        >>> can_keep_spectrum(model[3]), can_keep_spectrum(bandlimit(model, 0.5)[3])
        (False, True)
    """
    plan = block_plan(module)
    readers = [module.get_submodule(str(node.target)) for node in plan.readers]
    return plan.reason is None and any(
        isinstance(conv, BandLimitedConvNd) and conv.memory_lean for conv in readers
    )


def spectral_fallback(module: nn.Module) -> str | None:
    """Why ``module``'s last checkpointed training forward kept its full input, or ``None``.

    ``None`` also before any such forward. See :func:`checkpoint_from_spectrum`.
    """
    return _FALLBACKS.get(module)


# --------------------------------------------------------------------------------- running it
@dataclass(frozen=True, eq=False)
class _Reader:
    node: fx.Node
    conv: nn.Module
    plan: Any = None  # the DFT plan of a band-limited reader; None for a strided 1x1 one


def _readers(module: nn.Module, plan: BlockPlan, x: torch.Tensor) -> list[_Reader] | str:
    readers: list[_Reader] = []
    held = 0  # what the readers keep together
    for node in plan.readers:
        conv: Any = module.get_submodule(str(node.target))
        spatial_dims = len(conv.kernel_size)
        if x.dim() != spatial_dims + 2:
            return f"{node.target} reads an unbatched input"
        if isinstance(conv, BandLimitedConvNd):
            if not conv.memory_lean:
                return f"{node.target} is band-limited with memory_lean=False"
            band = input_plan(
                x,
                conv.weight,
                conv.bias,
                conv.stride,
                conv.padding,
                conv.dilation,
                conv.groups,
                conv.padding_mode,
                conv.compression,
                spatial_dims,
            )
            if band.band.is_full:
                return f"{node.target} keeps the full band at compression {conv.compression}"
            kept = spectrum_bytes(x, band)
            if kept >= x.nbytes:
                return (
                    f"{node.target}'s kept spectrum ({kept} bytes) is not smaller than the block's "
                    f"input ({x.nbytes} bytes) at compression {conv.compression}"
                )
            readers.append(_Reader(node, conv, band))
            held += kept
        elif (
            all(k == 1 for k in conv.kernel_size)
            and conv.padding in ("valid", (0,) * spatial_dims)
            and math.prod(conv.stride) > 1
        ):
            readers.append(_Reader(node, conv))
            held += x.nbytes // math.prod(conv.stride)
        else:
            return f"{node.target} ({type(conv).__name__}) is not band-limited and reads every pixel"
    if held >= x.nbytes:
        return f"its readers together keep {held} bytes, not fewer than the block's input ({x.nbytes} bytes)"
    return readers


class _Hold(torch.autograd.Function):
    """Identity that keeps its input for backward, so saved-tensor hooks see what a block keeps."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(t)
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def _execute(module: nn.Module, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args = fx.node.map_arg(node.args, env.__getitem__)
    kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
    if node.op == "call_module":
        return module.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "get_attr":
        return functools.reduce(getattr, str(node.target).split("."), module)
    if node.op == "output":
        return args[0]
    raise RuntimeError(f"unexpected node {node.format_node()}")


def _region(
    module: nn.Module, plan: BlockPlan, readers: list[_Reader], out_dtype: torch.dtype, *held: torch.Tensor
) -> tuple[Any, ...]:
    env: dict[fx.Node, Any] = {}
    with checkpointed_region(held):  # the readers' convolutions save the held spectra themselves
        for reader, kept in zip(readers, held):
            conv: Any = reader.conv
            spatial_dims = len(conv.kernel_size)
            if reader.plan is not None:
                env[reader.node] = conv_from_spectrum(
                    kept, conv.weight, conv.bias, reader.plan, spatial_dims, out_dtype
                )
            else:
                env[reader.node] = conv_function(spatial_dims)(
                    kept, conv.weight, conv.bias, 1, 0, conv.dilation, conv.groups
                )
        with keeping_spectra():
            _run(module, plan.region, env, keep=plan.outputs)
    return tuple(env[node] for node in plan.outputs)


def _run(
    module: nn.Module, nodes: tuple[fx.Node, ...], env: dict[fx.Node, Any], keep: tuple[fx.Node, ...]
) -> None:
    """Execute ``nodes`` not in ``env`` yet; a value is dropped after its last use among them (as
    ``fx.Interpreter`` does), so a recomputed block holds one or two feature maps, not all of them."""
    last_use: dict[fx.Node, int] = {}
    for i, node in enumerate(nodes):
        for used in node.all_input_nodes:
            last_use[used] = i
    for i, node in enumerate(nodes):
        if node not in env:
            env[node] = _execute(module, node, env)
        for used in node.all_input_nodes:
            if last_use[used] == i and used not in keep:
                env.pop(used, None)


def checkpoint_from_spectrum(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    context_fn: Callable[[], tuple[Any, Any]],
) -> tuple[bool, Any]:
    """Run ``module`` checkpointed, keeping only what its input's readers read, where it qualifies.

    Args:
        module: the block (checkpointed or not; its forward is traced once).
        args: the positional arguments of the call.
        kwargs: the keyword arguments of the call.
        context_fn: as ``torch.utils.checkpoint.checkpoint``'s (e.g. restoring BatchNorm
            running statistics during the recompute).

    Returns:
        ``(True, output)``, or ``(False, None)`` when the block does not qualify: the caller
        then checkpoints it ordinarily; :func:`spectral_fallback` gives the reason.
    """
    plan = block_plan(module)
    readers: list[_Reader] | str
    if plan.reason is not None:
        readers = plan.reason
    elif len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
        readers = "it is called with more than one tensor"
    else:
        readers = _readers(module, plan, args[0])
    if isinstance(readers, str):
        _FALLBACKS[module] = readers
        return False, None
    _FALLBACKS[module] = None
    x = args[0]
    held = []
    for reader in readers:
        if reader.plan is not None:
            held.append(_Hold.apply(analyse(x, reader.plan, len(reader.conv.kernel_size))))
            reader.conv.achieved_compression = reader.plan.band.compression
        else:
            # a copy, not a view: x's storage is freed
            pixels = stride_grid(x, reader.conv.stride).clone(memory_format=torch.contiguous_format)
            held.append(_Hold.apply(pixels))
    region = functools.partial(_region, module, plan, readers, conv_dtype(x))
    outs = torch.utils.checkpoint.checkpoint(region, *held, use_reentrant=False, context_fn=context_fn)
    env: dict[fx.Node, Any] = dict(zip(plan.outputs, outs))
    assert plan.input is not None
    env[plan.input] = x
    _run(module, plan.outside, env, keep=(plan.outside[-1],))
    return True, env[plan.outside[-1]]
