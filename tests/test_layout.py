"""The code flows one way: data -> learners -> evaluation -> report -> serve -> cli (docs/design.md).
A module imports from its own layer, from the layers before it and from the shared modules at
the package's root (errors, fileio, checks), never from a layer after it."""

from __future__ import annotations

import ast
from pathlib import Path

import ciosl

ORDER = ["data", "learners", "evaluation", "report", "serve", "cli"]
ROOT = Path(ciosl.__file__).parent
# known back-edges, each to be moved. The test fails when one is fixed and still listed, too.
KNOWN = set()


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "ciosl" or len(parts) < 2:
        return None
    return ORDER.index(parts[1]) if parts[1] in ORDER else None


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_layer_imports_a_later_one():
    back = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        own = _layer(".".join(["ciosl", *rel.parts]))
        if own is None:
            continue
        back += [f"{rel} imports {m}" for m in sorted(_imports(path))
                 if (other := _layer(m)) is not None and other > own]
    assert set(back) == KNOWN, set(back) ^ KNOWN
    assert _layer("ciosl.data.datasets") == 0 and _layer("ciosl.cli") == 5  # the check runs
