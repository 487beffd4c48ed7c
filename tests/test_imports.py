"""Who imports whom, read from the source (docs/design.md, "Layers"): two rules besides the layers'.

* No module of ``fa2_verify`` imports a command module (``fa2_verify.cli.commands.*``)
  but ``cli/main.py``, which registers them: what several commands share lives in
  ``app`` (or ``cli/arguments.py``, ``cli/tables.py``), never in one command.
* No two modules of ``fa2_verify`` import each other, directly or through a cycle:
  the module-level import graph, imports inside functions included, has no
  strongly connected component of more than one module.  An import under
  ``if TYPE_CHECKING:`` is for annotations only, never run, and is left out.

Each rule has a self-test showing that it sees a violation.  That no test
imports from ``lab/`` is tests/test_repository_layout.py's rule.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fa2_verify"
COMMANDS = "fa2_verify.cli.commands"
#: The one module that may import the command modules: it registers them.
REGISTRY_OF_COMMANDS = "fa2_verify.cli.main"


def modules(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module of ``package`` (a folder), by dotted name; a package by its own name (its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) in ``tree``."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped |= {inner for statement in node.body for inner in ast.walk(statement)}
    return skipped


def imported_modules(path: pathlib.Path, name: str, known: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``known`` that ``path`` (the module ``name``) imports, anywhere in it (functions
    included), relative imports resolved: ``import P.m`` names ``P.m``; ``from P import x`` names ``P.x``
    when that is a module, else ``P``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    return found - {name}


def import_graph(package: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (:func:`imported_modules`)."""
    known = modules(package)
    return {name: imported_modules(path, name, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan), as one cycle through it,
    ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(component, graph) for component in components]


def _cycle_through(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle from the first module of ``component`` back to it, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node] & component):
                if successor == start:
                    return paths[node] + [start]
                if successor not in paths:
                    paths[successor] = paths[node] + [successor]
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def command_importers(package: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the command modules it imports, for every module of ``package`` but the registry of commands."""
    graph = import_graph(package)
    return {
        name: commands
        for name, targets in graph.items()
        if name != REGISTRY_OF_COMMANDS
        and (commands := {target for target in targets if target == COMMANDS or target.startswith(COMMANDS + ".")})
    }


def test_no_module_but_main_imports_a_command_module():
    offenders = command_importers(PACKAGE)
    assert not offenders, f"import what commands share from fa2_verify.app or cli/arguments.py instead: {offenders}"


def test_no_modules_import_each_other():
    found = cycles(import_graph(PACKAGE))
    assert not found, "import cycles (move the shared piece down): " + "; ".join(" -> ".join(c) for c in found)


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """A throwaway ``fa2_verify`` package under ``tmp_path`` holding ``files`` (relative path -> source)."""
    package = tmp_path / "fa2_verify"
    for relative, source in {"__init__.py": "", **files}.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(source)
    return package


def test_the_command_check_sees_a_module_importing_a_command(tmp_path):
    package = _package(tmp_path, {
        "cli/__init__.py": "", "cli/commands/__init__.py": "", "cli/commands/run.py": "def helper():\n    pass\n",
        "cli/main.py": "from fa2_verify.cli.commands import run\n",
        "cli/commands/repro.py": "from fa2_verify.cli.commands.run import helper\n",
        "other.py": "def f():\n    import fa2_verify.cli.commands.run\n",
    })
    assert command_importers(package) == {
        "fa2_verify.cli.commands.repro": {"fa2_verify.cli.commands.run"},
        "fa2_verify.other": {"fa2_verify.cli.commands.run"},
    }


def test_the_cycle_check_sees_modules_importing_each_other(tmp_path):
    package = _package(tmp_path, {
        "a.py": "from fa2_verify import b\n",
        "b.py": "def f():\n    from fa2_verify.c import g\n",
        "c.py": "from fa2_verify.a import x\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fa2_verify.e import y\n",
        "e.py": "from fa2_verify.d import z\n",
        "f.py": "from fa2_verify import a\n",
    })
    assert cycles(import_graph(package)) == [["fa2_verify.a", "fa2_verify.b", "fa2_verify.c", "fa2_verify.a"]]
