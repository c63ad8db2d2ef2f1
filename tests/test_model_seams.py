"""The two method seams stay seams: no import circle inside model/, and the backbone modules name no method
(a method is a router and task extras, which live in their own modules and registries)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "model"
# Modules that are the registries or implement a router / an extra: they may name what they implement.
IMPLEMENTATIONS = {"routers.py", "learned_map.py", "pals.py", "registry.py"}
# Config modules declare the routers' and extras' fields, whose names checkpoints store.
CONFIG_FIELDS = {"config.py", "skill_layout.py", "bart.py"}
METHOD_NAMES = re.compile(r"moe|pals|learnable|eq6|dense_joint|task_specific", re.I)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level == 1:
            if n.module:
                out.add(n.module.split(".")[0])
            else:
                out.update(a.name for a in n.names)
    return out


def test_no_import_circle_inside_model():
    graph = {p.stem: _imports(p) for p in MODEL.glob("*.py")}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, f"import circle: {' -> '.join(path + [m])}"
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            visit(dep, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert "routers" in graph["skill_layout"] or "registry" in graph["skill_layout"]


def test_backbones_and_counts_name_no_method_and_branch_on_no_router():
    for path in sorted(MODEL.glob("*.py")):
        if path.name in IMPLEMENTATIONS:
            continue
        src = path.read_text(encoding="utf-8")
        assert not re.search(r"router\s*[!=]=", src), f"{path.name} branches on config.router"
        for i, line in enumerate(src.splitlines(), 1):
            if path.name in CONFIG_FIELDS and re.search(r"\b(moe|pals|learned)_[\w*]+", line):
                line = re.sub(r"\b(moe|pals|learned)_[\w*]+", "", line)  # a stored config field's name
            assert not METHOD_NAMES.search(line), f"{path.name}:{i} names a method: {line.strip()}"
