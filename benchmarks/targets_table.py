"""A kernel x property table (Markdown) from the property suite's JUnit files, for docs/targets.md.

``python3 benchmarks/targets_table.py OUT/properties-KERNEL-PROFILE.xml ...`` prints one
row per property and one column per file (named by the file's ``KERNEL-PROFILE``
part): ``pass``, ``FAIL`` with the first line of the failure and its one-line
reproduction, or ``unsupported`` with the reason the plugin gave.  A property
missing from a file is ``not run`` (a run stopped by its time limit leaves
nameless test cases in its JUnit file; they are not properties and are left out).
"""

from __future__ import annotations

import pathlib
import re
import sys
import xml.etree.ElementTree as ElementTree

_REPRO = re.compile(r"fa2-verify repro --kernel \S+ (?:--device \S+ )?--case '[^']*'")


def _cell(case: ElementTree.Element) -> str:
    failure = case.find("failure")
    if failure is None:
        failure = case.find("error")
    skipped = case.find("skipped")
    if failure is not None:
        text = (failure.get("message") or "") + "\n" + (failure.text or "")
        repro = _REPRO.search(text)
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        return f"FAIL: {first[:160]}" + (f" (`{repro.group(0)}`)" if repro else "")
    if skipped is not None:
        reason = (skipped.get("message") or "").removeprefix("Skipped: ").removeprefix("unsupported: ")
        return f"unsupported: {reason[:160]}"
    return "pass"


def _merged(shards: list[tuple[str, str]]) -> str:
    """One property's cell from its tests, ``(dtype, cell)`` each (dtype "" for an unsharded test): its first
    failure; else ``pass`` naming the dtypes that finished (a run stopped by its time limit lists fewer than
    the kernel draws); else the reason it is unsupported."""
    failures = [cell for _, cell in shards if cell.startswith("FAIL")]
    if failures:
        return failures[0]
    passed = [dtype for dtype, cell in shards if cell == "pass"]
    if passed:
        named = [dtype for dtype in passed if dtype]
        return "pass" + (f" ({', '.join(named)})" if named else "")
    return shards[0][1]


def outcomes(junit: pathlib.Path) -> dict[str, str]:
    """Property name -> its cell in the table, over the property's tests (``test_x[float16]``: one per dtype)."""
    shards: dict[str, list[tuple[str, str]]] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name, _, dtype = case.get("name", "").partition("[")
        if name:
            shards.setdefault(name, []).append((dtype.rstrip("]"), _cell(case)))
    return {name: _merged(cases) for name, cases in shards.items()}


def table(files: list[pathlib.Path]) -> str:
    columns = {path.stem.removeprefix("properties-"): outcomes(path) for path in files}
    names = sorted({name for cells in columns.values() for name in cells})
    lines = ["| property | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name in names:
        cells = [columns[column].get(name, "not run").replace("|", "\\|") for column in columns]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([pathlib.Path(argument) for argument in sys.argv[1:]]))
