"""The package's layers only point down (docs/design.md, "Layers"), read from the imports of every module.

``core`` imports nothing else of fa2-verify; ``kernels`` and ``golden`` only
``core``; ``verify`` those three; ``records`` those four; ``app`` those five;
``bench`` and ``properties`` everything below them, not each other; ``cli``
sits on top.  A module may import its own layer.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fa2_verify"

#: layer -> the layers it may import (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "kernels": frozenset({"core"}),
    "golden": frozenset({"core"}),
    "verify": frozenset({"core", "kernels", "golden"}),
    "records": frozenset({"core", "kernels", "golden", "verify"}),
    "app": frozenset({"core", "kernels", "golden", "verify", "records"}),
    "bench": frozenset({"core", "kernels", "golden", "verify", "records", "app"}),
    "properties": frozenset({"core", "kernels", "golden", "verify", "records", "app"}),
    "cli": frozenset({"core", "kernels", "golden", "verify", "records", "app", "bench", "properties"}),
}


def imported_layers(path: pathlib.Path) -> set[str]:
    """The ``fa2_verify`` subpackages a module imports (``import``, ``from ... import``, also inside functions)."""
    layers = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" if node.module == "fa2_verify" else node.module for alias in node.names]
        else:
            continue
        layers |= {name.split(".")[1] for name in names if name.startswith("fa2_verify.") and name.count(".") >= 1}
    return layers


MODULES = sorted(path for layer in ALLOWED for path in (PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_and_those_below(path):
    layer = path.relative_to(PACKAGE).parts[0]
    upward = imported_layers(path) - ALLOWED[layer] - {layer} - {"__version__"}
    assert not upward, f"{path.relative_to(PACKAGE)} ({layer}) imports {sorted(upward)}, above or beside it"


def test_every_subpackage_has_a_layer():
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(ALLOWED)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fa2_verify.verify.check import check_case\n")
    assert imported_layers(module) == {"verify"}
