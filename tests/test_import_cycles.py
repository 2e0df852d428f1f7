"""No import cycles among fedrift's modules.

Every import statement of every module under ``src/fedrift`` counts, at any depth: module
level, inside functions, and under ``if TYPE_CHECKING:`` too (a cycle there is one a type
checker walks; the project's hook counts them as well). Relative imports are resolved; an
import names the innermost fedrift module it reaches (``from fedrift.data import devices``
is an edge to ``fedrift.data.devices``); a module importing its own package (``__init__``)
is not an edge. Read with ``ast``, nothing imported: a cycle hidden behind a function-level
import still fails here, printed as a path of modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src``: dotted name (a package by its own name) -> file."""
    files = {}
    for f in sorted((src / package).rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return files


def imported_names(node: ast.AST, module: str, file: Path) -> list[str]:
    """The names an import statement in ``module`` imports, relative ones made absolute (a
    ``from`` import: the module and each name under it); [] for any other statement."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    here = module.split(".") if file.name == "__init__.py" else module.split(".")[:-1]  # the package of a relative import
    base = node.module or ""
    if node.level:
        base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def module_graph(src: Path, package: str) -> dict[str, set[str]]:
    files = module_files(src, package)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, f in files.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            for name in imported_names(node, m, f):
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != m and not m.startswith(name + "."):
                    graph[m].add(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None: a depth-first walk that meets a module
    still on its path."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, todo = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom . import c\n")
    (pkg / "sub" / "c.py").write_text("import pkg.sub\n")
    graph = module_graph(tmp_path, "pkg")
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub", "pkg.sub.b"}, "pkg.sub": set(),
                     "pkg.sub.b": {"pkg.a", "pkg.sub.c"}, "pkg.sub.c": set()}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    del graph["pkg.sub.b"]
    graph["pkg.a"] = set()
    assert find_cycle(graph) is None


def test_fedrift_has_no_import_cycle():
    cycle = find_cycle(module_graph(SRC, "fedrift"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The layers of docs/reference/layout.md, lowest first: a unit (a top-level module, or a
# subpackage as a whole) imports units of its own layer or of layers below it, never above.
LAYERS = [
    {"errors", "safe_files", "version", "yamlio", "_omp", "_malloc", "_inductor_cache", "stopping"},
    {"registry", "params", "overrides", "pretrained", "cache"},
    {"plugins"},
    {"config"},
    {"functional", "data", "models", "metrics"},
    {"algorithms"},
    {"engine"},
    {"api", "deploy", "report"},
    {"experiments"},
    {"cli", "fedrift"},
]


def unit_of(module: str) -> str:
    """``fedrift.engine.executors.base`` -> ``engine``; ``fedrift.cli`` -> ``cli``; the package
    itself -> ``fedrift``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    level = {u: i for i, units in enumerate(layers) for u in units}
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit_of(module), unit_of(target)
            if a != b and level.get(b, len(layers)) > level.get(a, -1):
                out.append(f"{module} ({a}) imports {target} ({b})")
    return out


def test_the_layer_check_finds_an_upward_import():
    graph = {"fedrift.config": {"fedrift.errors"}, "fedrift.algorithms.x": {"fedrift.engine.loop"},
             "fedrift.engine.loop": {"fedrift.algorithms.x"}}
    assert upward_imports(graph, LAYERS) == ["fedrift.algorithms.x (algorithms) imports fedrift.engine.loop (engine)"]


def test_every_unit_has_a_layer_and_imports_only_downward():
    graph = module_graph(SRC, "fedrift")
    placed = {u for units in LAYERS for u in units}
    assert {unit_of(m) for m in graph} <= placed, f"units without a layer: {sorted({unit_of(m) for m in graph} - placed)}"
    assert upward_imports(graph, LAYERS) == []


def load_time_imports(src: Path, package: str) -> dict[str, set[str]]:
    """Per module, what importing it imports at once: the imports run at module level (inside
    ``if``, ``try``, ``with`` and class bodies too), not those in functions or under ``if
    TYPE_CHECKING:``. Names as written (absolute, relative ones resolved), not narrowed."""
    out: dict[str, set[str]] = {}
    for module, f in module_files(src, package).items():
        names: set[str] = set()
        todo = list(ast.parse(f.read_text(), str(f)).body)
        while todo:
            node = todo.pop()
            names |= set(imported_names(node, module, f))
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                todo += node.orelse
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    todo += getattr(node, field, [])
            elif isinstance(node, ast.ExceptHandler):
                todo += node.body
        out[module] = names
    return out


def imported_with(module: str, imports: dict[str, set[str]]) -> set[str]:
    """Every name importing ``module`` reaches at load time: fedrift's modules (with their
    packages' ``__init__``) followed, others' top-level names collected."""
    seen, outside, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # a module's packages are imported first
            m = ".".join(parts[:k])
            if m in imports and m not in seen:
                seen.add(m)
                todo += sorted(imports[m])
        if parts[0] != "fedrift":
            outside.add(parts[0])
    return outside


def test_the_command_loads_no_plotting_or_scipy_until_it_draws():
    """``fedrift`` (the package, the command, a Flower app, a worker) imports matplotlib,
    scipy, scikit-learn and the DP accountant only where they are used: each cost about a
    second of a core in every process that starts (the suite starts hundreds)."""
    imports = load_time_imports(SRC, "fedrift")
    heavy = {"matplotlib", "scipy", "sklearn", "dp_accounting", "optuna", "ray", "flwr", "transformers"}
    for module in ("fedrift", "fedrift.cli", "fedrift.engine.executors.processes"):
        assert not imported_with(module, imports) & heavy, (module, imported_with(module, imports) & heavy)
    assert imported_with("fedrift.report.plots", imports) >= {"matplotlib"}  # the walk sees them where they are
