"""The library's import graph: no circle between its modules, and no arrow from a lower package up.

The graph is read from the source (ast), over every module that pyproject's package-dir table maps into
``skillnet.*``: absolute ``skillnet.`` imports and relative ones, at module level or inside functions (a lazy
import is still a dependency), ``TYPE_CHECKING`` blocks included (a circle of type names is a circle of
design). Only an ``if __name__ == "__main__":`` block is left out: it runs when the file is the program,
which no other module imports, so it cannot close a circle. Importing a package's own ``__init__`` from a
module inside it is no edge either (Python has initialised the parent first).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]

# Circles still open: each with why. The test fails when one of them changes (closed: remove it here) and when
# any other appears.
KNOWN_CYCLES: list[set[str]] = []
# Layers, bottom first: a package may import those before it, never one after it.
LOWER = ["common", "model", "data_prep", "training", "export"]
UPPER = ["pretrain", "finetune", "experiments"]


def _modules() -> dict[str, Path]:
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mods = {}
    for pkg, folder in table.items():
        for f in (REPO / folder).glob("*.py"):
            mods[pkg if f.name == "__init__.py" else f"{pkg}.{f.stem}"] = f
    return mods


def _targets(mods: dict[str, Path], module: str, node: ast.ImportFrom | ast.Import) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")[: None if mods[module].name == "__init__.py" else -1]
            base = base[: len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        subs = [f"{prefix}.{a.name}" for a in node.names]
        # `from pkg import mod` imports the module; `from pkg import name` the package that defines it
        names = [s if s in mods else prefix for s in subs]
    out = set()
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != module and not module.startswith(name + "."):
            out.add(name)
    return out


def _is_main_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(n) for top in tree.body if _is_main_block(top) for n in ast.walk(top)}
        edges[name] = set()
        for node in ast.walk(tree):
            if id(node) not in skip and isinstance(node, ast.Import | ast.ImportFrom):
                if isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("skillnet"):
                    continue
                edges[name] |= _targets(mods, name, node)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_the_graph_sees_the_library(graph: dict[str, set[str]]) -> None:
    """A check over nothing passes: the reader must find the modules and their imports."""
    assert len(graph) > 100
    assert "skillnet.training.callbacks" in graph["skillnet.training.trainer"]  # relative
    assert "skillnet.export.card" in graph["skillnet.finetune.build"]  # absolute, inside a function
    assert "skillnet.finetune.run" in graph["skillnet.finetune.cli"]


def test_no_import_cycle_between_library_modules(graph: dict[str, set[str]]) -> None:
    cycles = _cycles(graph)
    assert sorted(map(sorted, cycles)) == sorted(map(sorted, KNOWN_CYCLES)), cycles


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_lower_packages_never_import_upper_ones(graph: dict[str, set[str]]) -> None:
    """common < model < data_prep < training < export < pretrain, finetune, experiments: export/ serves
    fine-tuned models without importing finetune/ (what it needs is passed in), data_prep/ uses the command
    conventions of common/ and not training/, and model/ stays plain PyTorch + transformers."""
    def pkg(module: str) -> str:
        return module.split(".")[1] if module.count(".") else ""

    wrong = []
    for src, targets in graph.items():
        a = pkg(src)
        for dst in targets:
            b = pkg(dst)
            if a == b or a not in LOWER:
                continue
            if b in UPPER or (b in LOWER and LOWER.index(b) > LOWER.index(a)):
                wrong.append(f"{src} -> {dst}")
    assert not wrong, wrong
