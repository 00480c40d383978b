"""The package's imports flow one way: no module imports, even lazily, one that imports it back.

Every ``import`` / ``from ... import`` of ``lightning_bandlimit`` anywhere in a module's source
(top level, inside functions, under ``TYPE_CHECKING``) is an edge. ``from package import name``
is an edge to ``package.name`` when that is a module, else to the package's ``__init__``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import lightning_bandlimit

ROOT = Path(lightning_bandlimit.__file__).resolve().parent
PACKAGE = "lightning_bandlimit"

# Rooms, lowest first: a module may import its own room and the rooms below it only.
LAYERS: list[tuple[str, ...]] = [
    ("utils",),
    ("memory", "data"),  # memory probes and datasets: they need only utils
    ("functional",),
    ("layers",),  # band-limited and lean layers, surgery, BatchNorm re-estimation
    ("recompute",),  # units, switching, spectral recompute, stages, the saved-tensor meter
    ("ladder",),  # the decision policy, torch-free
    ("tenants",),  # a device's tenants: the ledger and the rule they share, torch-free
    ("microbatch",),  # the micro-batch lever: a step's batch in chunks (torch, Lightning)
    ("health",),  # a job's peers: ordered exit, heartbeats, stragglers (torch.distributed)
    ("strategies", "callbacks"),
    ("models",),  # the example LightningModule may use the strategies' schedules
    ("recipes",),
    ("jobs", "__main__"),  # command line, the main job and its scenario
]
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [
                f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import a.b.c`` where c is an attribute
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != PACKAGE and target != name:
                found.add(target)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module} belongs to no layer; add its top-level name to LAYERS")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle's members (Tarjan's strongly connected components with more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = _graph()
    # ``main`` imports the robustness recipe inside a function: a lazy import is still an edge
    assert "lightning_bandlimit.recipes.robustness" in graph["lightning_bandlimit.jobs.cli"]
    # sanity's record type is imported for annotations only, under TYPE_CHECKING
    results = "lightning_bandlimit.recipes.results"
    assert f"{results}.records" in graph[f"{results}.sanity"]


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_imports_flow_down_the_layers(module: str) -> None:
    if module == PACKAGE:
        pytest.skip("the package's __init__ re-exports the public API from every layer")
    upward = sorted(t for t in _graph()[module] if _layer(t) > _layer(module))
    assert not upward, f"{module} (layer {_layer(module)}) imports a higher layer: {upward}"


def _private_imports(name: str, source: str) -> list[str]:
    """``from <a lightning_bandlimit module> import _name`` in ``source`` (relative imports too).

    ``name`` is the importing module's dotted name (a package's is its own). Dunder names such as
    ``__version__`` are public.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            is_package = name in _modules() and _modules()[name].name == "__init__.py"
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module != PACKAGE and not module.startswith(PACKAGE + "."):
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not (alias.name.startswith("__") and alias.name.endswith("__")):
                found.append(f"{module}.{alias.name}")
    return found


def test_private_import_finder() -> None:
    source = (
        "from lightning_bandlimit.functional.dft_plan import _positions, dft_plan\n"
        "from .protocol import _describe\n"
        "from .. import __version__\n"
        "from torch import _C\n"
        "def f():\n    from lightning_bandlimit.memory import _torch\n"
    )
    assert _private_imports("lightning_bandlimit.memory.host", source) == [
        "lightning_bandlimit.functional.dft_plan._positions",
        "lightning_bandlimit.memory.protocol._describe",
        "lightning_bandlimit.memory._torch",
    ]


def test_no_private_name_is_imported_from_another_module() -> None:
    """A name another module needs is public (no underscore, in its module's ``__all__``)."""
    found = {
        name: imports
        for name, path in _modules().items()
        if (imports := _private_imports(name, path.read_text()))
    }
    assert not found, "private names imported across modules: " + "; ".join(
        f"{name} imports {', '.join(imports)}" for name, imports in sorted(found.items())
    )


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's top-level statements, those under top-level ``if`` / ``try`` included."""
    found: list[ast.stmt] = []
    for node in body:
        found.append(node)
        if isinstance(node, ast.If):
            found += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            found += _top_level(node.body + handlers + node.orelse + node.finalbody)
    return found


def _all_entries(body: list[ast.stmt]) -> list[str]:
    """The names a module's ``__all__`` lists (its assignment, and any ``+=``)."""
    names: list[str] = []
    for node in _top_level(body):
        if isinstance(node, ast.Assign):
            target = node.targets[0]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            target = node.target
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and target.id == "__all__"
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            names += [element.value for element in node.value.elts if isinstance(element, ast.Constant)]
    return names


def _reexports(name: str, source: str, package: bool = False) -> list[str]:
    """What module ``name`` passes on from elsewhere (``source``: its text).

    A room's ``__init__`` (``package``; the package's own excepted: it is the public API) may
    import from its own room only: each other room's module of ``lightning_bandlimit`` it imports
    is listed. Any other module may not name in its ``__all__`` what it imported: each name bound
    by a top-level ``from ... import`` that ``__all__`` lists is, as ``<its module>.<name>``.
    """
    tree = ast.parse(source)

    def origin(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = name.split(".") if package else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    if package:
        if name == PACKAGE:
            return []
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = [origin(node)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            found += [
                t
                for t in targets
                if (t == PACKAGE or t.startswith(PACKAGE + "."))
                and t != name
                and not t.startswith(name + ".")
            ]
        return found
    imported = {
        alias.asname or alias.name: f"{origin(node)}.{alias.name}"
        for node in _top_level(tree.body)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    return [imported[entry] for entry in _all_entries(tree.body) if entry in imported]


def test_reexport_finder() -> None:
    module = (
        "from lightning_bandlimit.utils.units import MIB\n"
        "from .protocol import MemoryReading as Reading, ProbeUnavailable\n"
        "try:\n    from numpy import ndarray\nexcept ImportError:\n    ndarray = None\n"
        "def f():\n    from lightning_bandlimit.ladder import Setting\n"
        "own = 1\n"
        "__all__ = ['MIB', 'Reading', 'own']\n"
        "__all__ += ['ndarray']\n"
    )
    assert _reexports("lightning_bandlimit.memory.host", module) == [
        "lightning_bandlimit.utils.units.MIB",
        "lightning_bandlimit.memory.protocol.MemoryReading",
        "numpy.ndarray",
    ]
    init = (
        "from lightning_bandlimit.memory.probes import auto_probe\n"
        "from . import scripted\n"
        "from lightning_bandlimit.ladder import Setting\n"
        "from ..utils import units\n"
        "import lightning_bandlimit.data\n"
    )
    assert _reexports("lightning_bandlimit.memory", init, package=True) == [
        "lightning_bandlimit.ladder",
        "lightning_bandlimit.utils",
        "lightning_bandlimit.data",
    ]
    assert _reexports(PACKAGE, init, package=True) == []  # the public API gathers every room's names


def test_no_module_reexports_another_modules_names() -> None:
    """A name's homes are the module that defines it and its room's ``__init__``: no other module
    lists another's names in its ``__all__``, and no room's ``__init__`` imports another room."""
    found = {
        name: names
        for name, path in _modules().items()
        if (names := _reexports(name, path.read_text(), package=path.name == "__init__.py"))
    }
    assert not found, "re-exports: " + "; ".join(
        f"{name}: {', '.join(names)}" for name, names in sorted(found.items())
    )


# The robustness recipe's rooms, lowest first: the threats (attacks and bands), the results (records,
# report, study), the evaluation engine, then the command line's front.
RECIPE_ROOMS: list[tuple[str, ...]] = [
    ("threats",),
    ("results",),
    ("evaluation",),
    ("robustness",),
]


def _room(module: str) -> int:
    room = module.split(".")[2]
    for rank, names in enumerate(RECIPE_ROOMS):
        if room in names:
            return rank
    raise AssertionError(f"{module} belongs to no room of the recipe; add it to RECIPE_ROOMS")


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith(f"{PACKAGE}.recipes.")))
def test_recipe_rooms_import_downwards(module: str) -> None:
    recipe = [t for t in _graph()[module] if t.startswith(f"{PACKAGE}.recipes.")]
    upward = sorted(t for t in recipe if _room(t) > _room(module))
    assert not upward, f"{module} (room {_room(module)}) imports a later room: {upward}"


def test_no_module_is_loose_in_the_package_root() -> None:
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules loose in the package root (give each a room): {loose}"


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_the_ladder_and_tenants_rooms_need_no_torch() -> None:
    """The ladder and the tenants' rule are plain Python: no import of torch (checked on the source)."""
    for name, path in _modules().items():
        if name.startswith((f"{PACKAGE}.ladder", f"{PACKAGE}.tenants")):
            third_party = {
                alias.name.split(".")[0]
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Import)
                for alias in node.names
            } | {
                (node.module or "").split(".")[0]
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and not node.level
            }
            assert not third_party & {"torch", "lightning", "numpy"}, f"{name} imports {third_party}"
            inner = {t.split(".")[1] for t in _graph()[name]}
            assert inner <= {"ladder", "tenants", "utils"}, f"{name} imports {inner}"


# The controller's state changes only through its methods named for events, each called from one
# place in the package (outside ladder/); every other public method only reads.
CONTROLLER_EVENTS = {
    "decide",  # a check
    "load_state_dict",  # a resumed run
    "observe",  # a measured step: its peak
    "observe_time",  # a measured step: its time
    "on_continuum_chosen",  # where the compression continuum runs, once the units are known
    "on_oom",  # an out-of-memory error
    "on_outside_change",  # a change the controller did not decide
    "on_ranks_agreed",  # the ranks agreed on the top rung and the continuum
    "on_stages_measured",  # the stages measured (or only counted)
    "on_splits_chosen",  # the micro-batch splits tried, once the first batch ran
}
CONTROLLER_QUERIES = {
    "clamp",
    "exact_points",
    "hinted",
    "idle_from",
    "lossy",
    "lossy_rung",
    "lossy_split",
    "make_room",
    "measured",
    "peak_noise",
    "peer_memory",
    "predict",
    "predict_rung",
    "slowdown",
    "spare",
    "state_dict",
    "surprise",
}


def _is_controller(node: ast.expr) -> bool:
    """Whether ``node`` names a ladder controller: ``controller`` or ``<anything>.controller``."""
    return (isinstance(node, ast.Name) and node.id == "controller") or (
        isinstance(node, ast.Attribute) and node.attr == "controller"
    )


def _controller_uses(source: str) -> tuple[list[str], list[str]]:
    """The controller attributes ``source`` writes (assigns, augments or deletes), and the
    controller methods it calls, by name (a name once per call site)."""
    writes, calls = [], []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and _is_controller(leaf.value):
                    writes.append(leaf.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_controller(node.func.value)
        ):
            calls.append(node.func.attr)
    return writes, calls


def test_controller_use_finder() -> None:
    source = (
        "self.controller.top = 3\n"
        "a.controller.peer_memory, b = 1, 2\n"
        "controller.oom_floor += 1\n"
        "x = self.controller.top\n"
        "self.controller.decide(r, s)\n"
        "controller.predict(s)\n"
    )
    assert _controller_uses(source) == (["top", "peer_memory", "oom_floor"], ["decide", "predict"])


def test_the_controller_is_changed_only_by_its_events_from_one_place() -> None:
    """Outside ``ladder/`` no module writes a controller attribute, and each event method of the
    controller is called from one place (the callback that feeds it)."""
    from lightning_bandlimit.ladder import LadderController

    public = {name for name in dir(LadderController) if not name.startswith("_")}
    assert public == CONTROLLER_EVENTS | CONTROLLER_QUERIES, (
        "classify each public LadderController method as an event (changes state) or a query: "
        f"{sorted(public ^ (CONTROLLER_EVENTS | CONTROLLER_QUERIES))}"
    )
    written, called = {}, {}
    for name, path in _modules().items():
        if name.startswith(f"{PACKAGE}.ladder"):
            continue
        writes, calls = _controller_uses(path.read_text())
        if writes:
            written[name] = writes
        for method in calls:
            called.setdefault(method, []).append(name)
    assert not written, f"controller state written outside ladder/: {written}"
    twice = {m: places for m, places in called.items() if m in CONTROLLER_EVENTS and len(places) > 1}
    assert not twice, f"controller events called from more than one place: {twice}"
