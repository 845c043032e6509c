"""The runtime's packages form layers: each imports only packages in lower layers.

The graph is read from the source with ``ast``: every ``import`` / ``from ... import``
of ``radixlm.runtime`` at module level or inside a function (imports under
``if TYPE_CHECKING:`` never run and are left out). A node is a runtime subpackage
(``attention``, ``models``, ...) or a top-level module (``config``, ``errors``, ...);
``entrypoints.http`` and ``entrypoints.cli`` are nodes of their own, above the engine.

A function-level import of another runtime package is how a cycle hides, so each one
must be in ``FUNCTION_LEVEL_IMPORTS`` with its reason; every function-level import in
the runtime (of anything) carries a ``# lazy: <why>`` comment, on its line or on the
line above its run of imports. A ``TYPE_CHECKING`` import that names a higher layer
(an annotation only) must be in ``UPWARD_ANNOTATIONS`` with its reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
PACKAGE = "radixlm.runtime"

# Lowest first. A node imports only nodes of lower layers; nodes of one layer do not
# import each other. docs/architecture.md ("Packages in layers") says why.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "device",
        "child_process",
        "histogram",
        "host_memory",
        "json_depth",
        "regex_size",
        "tools",
    ),
    ("config_checks", "layers"),
    ("model_store",),
    ("constrained",),
    ("reasoning",),
    ("config",),
    ("io", "mem_cache"),
    ("sampling",),
    ("attention",),
    ("models",),
    ("executor",),
    ("speculative",),
    ("scheduling",),
    ("distributed",),
    ("entrypoints",),
    ("entrypoints.http",),
    ("entrypoints.cli",),
)

# (importing file under runtime/, imported module) -> why it is imported in a function.
# None is needed now: an entry wants a reason a top-level import cannot serve (a cost
# paid on one path only), never a cycle.
FUNCTION_LEVEL_IMPORTS: dict[tuple[str, str], str] = {}

# Imports under ``if TYPE_CHECKING:`` that name a node of the same or a higher layer:
# annotations only (they never run), each listed with why the type is not moved down.
UPWARD_ANNOTATIONS: dict[tuple[str, str], str] = {
    ("attention", "models"): "BackendContext.arch is the model's ArchConfig",
    ("models", "distributed"): "a model shard takes its rank's TensorParallelGroup",
    ("executor", "distributed"): "the runner sends passes to the TensorParallelRanks",
    ("speculative", "scheduling"): "the controller reads the scheduler's Request fields",
}

# The only nodes that may import radixlm.runtime.entrypoints.
ENTRYPOINT_NODES = {"entrypoints", "entrypoints.http", "entrypoints.cli"}

LAZY_MARK = "# lazy:"


@dataclass(frozen=True)
class Import:
    file: str  # relative to runtime/
    line: int
    module: str  # the imported module, absolute
    in_function: bool

    @property
    def where(self) -> str:
        return f"runtime/{self.file}:{self.line} imports {self.module}"


def node_of(module: str) -> str | None:
    """The layer node of a ``radixlm.runtime`` module (None: the runtime root)."""
    parts = module.split(".")[2:]
    if not parts:
        return None
    if parts[0] == "entrypoints" and len(parts) > 1 and parts[1] in _TOP_ENTRYPOINTS:
        return _TOP_ENTRYPOINTS[parts[1]]
    return parts[0]


# The entrypoints above the Engine: the server, and the command with the replica
# launcher (fleet.py runs servers) beside it.
_TOP_ENTRYPOINTS = {
    "http": "entrypoints.http",
    "cli": "entrypoints.cli",
    "fleet": "entrypoints.cli",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _targets(node: ast.Import | ast.ImportFrom, path: Path) -> list[str]:
    """The absolute modules an import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        here = module_name(path).split(".")
        if path.name != "__init__.py":
            here.pop()
        here = here[: len(here) - node.level + 1]
        base = ".".join(here + ([node.module] if node.module else []))
    if base == PACKAGE:  # from radixlm.runtime import config
        return [f"{base}.{alias.name}" for alias in node.names]
    return [base]


def _walk(node: ast.AST, in_function: bool, annotations: bool = False):
    """(import statement, inside a function) pairs; the TYPE_CHECKING blocks' imports
    instead (only them) with ``annotations``."""
    for child in ast.iter_child_nodes(node):
        if _is_type_checking(child):
            if annotations:
                yield from _walk(child, in_function, annotations=False)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom) and not annotations:
            yield child, in_function
        function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, in_function or function, annotations)


def runtime_sources() -> list[Path]:
    return sorted(RUNTIME.rglob("*.py"))


def runtime_imports(annotations: bool = False) -> list[Import]:
    """Every import that runs; the TYPE_CHECKING ones instead with ``annotations``."""
    found = []
    for path in runtime_sources():
        for node, in_function in _walk(ast.parse(path.read_text()), False, annotations):
            for module in _targets(node, path):
                rel = str(path.relative_to(RUNTIME))
                found.append(Import(rel, node.lineno, module, in_function))
    return found


def cross_node(imp: Import) -> tuple[str, str] | None:
    """(importer's node, imported node) where an import crosses nodes."""
    if not imp.module.startswith(PACKAGE + "."):
        return None
    src = node_of(module_name(RUNTIME / imp.file))
    dst = node_of(imp.module)
    if src is None or dst is None or src == dst:
        return None
    return src, dst


def edges(annotations: bool = False) -> dict[tuple[str, str], list[Import]]:
    graph: dict[tuple[str, str], list[Import]] = {}
    for imp in runtime_imports(annotations):
        edge = cross_node(imp)
        if edge is not None:
            graph.setdefault(edge, []).append(imp)
    return graph


def cycles(graph: dict[tuple[str, str], list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    succ: dict[str, set[str]] = {}
    for src, dst in graph:
        succ.setdefault(src, set()).add(dst)
        succ.setdefault(dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


def rank() -> dict[str, int]:
    return {node: i for i, layer in enumerate(LAYERS) for node in layer}


def test_the_cycle_finder_finds_cycles():
    imp = Import("x.py", 1, "m", False)
    graph = {("a", "b"): [imp], ("b", "c"): [imp], ("c", "a"): [imp], ("c", "d"): [imp]}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({("a", "b"): [imp], ("b", "c"): [imp]}) == []


def test_every_runtime_node_has_a_layer():
    nodes = {node_of(module_name(p)) for p in runtime_sources()} - {None}
    declared = [node for layer in LAYERS for node in layer]
    assert len(declared) == len(set(declared)), "a node is declared twice"
    assert nodes == set(declared), (
        f"undeclared: {sorted(nodes - set(declared))}; gone: {sorted(set(declared) - nodes)}"
    )


def test_no_import_cycle_between_runtime_packages():
    graph = edges()
    found = cycles(graph)
    detail = [
        imp.where
        for component in found
        for (src, dst), imports in graph.items()
        if src in component and dst in component
        for imp in imports
    ]
    assert not found, f"import cycles {found}:\n" + "\n".join(detail)


def test_each_package_imports_only_lower_layers():
    ranks = rank()
    wrong = [
        f"{src} (layer {ranks[src]}) -> {dst} (layer {ranks[dst]}): {imp.where}"
        for (src, dst), imports in sorted(edges().items())
        if src in ranks and dst in ranks and ranks[dst] >= ranks[src]
        for imp in imports
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_upward_annotation_imports_are_listed():
    ranks = rank()
    upward = {
        edge: imports
        for edge, imports in edges(annotations=True).items()
        if ranks[edge[1]] >= ranks[edge[0]]
    }
    unlisted = [
        imp.where for edge in upward.keys() - UPWARD_ANNOTATIONS.keys() for imp in upward[edge]
    ]
    assert not unlisted, (
        "TYPE_CHECKING imports against the layers (move the type down, or take a Protocol "
        "of the lower layer):\n" + "\n".join(unlisted)
    )
    assert not UPWARD_ANNOTATIONS.keys() - upward.keys(), "stale UPWARD_ANNOTATIONS entries"


def test_only_the_entrypoints_import_the_entrypoints():
    wrong = [
        imp.where
        for (src, dst), imports in edges().items()
        if dst in ENTRYPOINT_NODES and src not in ENTRYPOINT_NODES
        for imp in imports
    ]
    assert not wrong, "\n".join(wrong)


def test_function_level_imports_across_packages_are_listed():
    found = {
        (imp.file, imp.module)
        for imp in runtime_imports()
        if imp.in_function and cross_node(imp) is not None
    }
    unlisted = sorted(found - FUNCTION_LEVEL_IMPORTS.keys())
    assert not unlisted, (
        "function-level imports of another runtime package (import at the top, or list "
        f"it in FUNCTION_LEVEL_IMPORTS with its reason): {unlisted}"
    )
    assert not FUNCTION_LEVEL_IMPORTS.keys() - found, "stale FUNCTION_LEVEL_IMPORTS entries"
    assert all(reason.strip() for reason in FUNCTION_LEVEL_IMPORTS.values())


def _unmarked(path: Path) -> list[str]:
    """This file's function-level imports with no ``# lazy:`` comment on their first line
    or on the line above their run of consecutive imports."""
    lines = path.read_text().splitlines()
    statements = [
        node for node, in_function in _walk(ast.parse("\n".join(lines)), False) if in_function
    ]
    covered = {n for s in statements for n in range(s.lineno, (s.end_lineno or s.lineno) + 1)}
    unmarked = []
    for statement in statements:
        above = statement.lineno - 1
        while above in covered:
            above -= 1
        if LAZY_MARK not in lines[statement.lineno - 1] and LAZY_MARK not in lines[above - 1]:
            unmarked.append(f"runtime/{path.relative_to(RUNTIME)}:{statement.lineno}")
    return unmarked


def test_function_level_imports_say_why_they_are_lazy():
    unmarked = [where for path in runtime_sources() for where in _unmarked(path)]
    assert not unmarked, f"function-level imports without a {LAZY_MARK!r} comment: {unmarked}"
