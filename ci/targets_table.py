"""A kernel x property table (Markdown) from the property suite's JUnit files, for docs/targets.md.

``python3 ci/targets_table.py OUT/properties-KERNEL-PROFILE.xml ...`` prints one
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


def outcomes(junit: pathlib.Path) -> dict[str, str]:
    """Property name -> its cell in the table."""
    cells = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        if not name:
            continue
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            text = (failure.get("message") or "") + "\n" + (failure.text or "")
            repro = _REPRO.search(text)
            first = next((line.strip() for line in text.splitlines() if line.strip()), "")
            cells[name] = f"FAIL: {first[:160]}" + (f" (`{repro.group(0)}`)" if repro else "")
        elif skipped is not None:
            reason = (skipped.get("message") or "").removeprefix("Skipped: ").removeprefix("unsupported: ")
            cells[name] = f"unsupported: {reason[:160]}"
        else:
            cells[name] = "pass"
    return cells


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
