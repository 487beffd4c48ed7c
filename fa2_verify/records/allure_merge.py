"""Allure results of several runner shards of one property-suite run, merged into one set of results.

The property plugin describes each run in its results directory, in Allure's
own environment file ``environment.properties`` (:func:`write_run`; Allure
shows it as the report's environment): the kernel, the device, the profile,
the dtypes asked for and the runner shard ``I/N`` (``1/1`` for a run that
was not split).  :func:`plan` reads several directories and refuses, in one
line naming the directories, any set that is not one complete run:

* a directory without Allure results, or (when there are several) without
  the description: nothing says which run it belongs to;
* two directories that disagree on the kernel, the device, the profile or
  the dtypes;
* shards of different splits (``1/2`` and ``1/3``), the same shard twice, or
  a shard missing (``2/3`` with only ``1/3`` and ``3/3``): the report would
  leave out tests and still look whole;
* a test (Allure's ``fullName``) in two directories: a test belongs to one
  shard.

:func:`write_merged` then copies every file of every directory into one (a
file of the same name in two directories must have the same bytes) and
describes the result as the whole run (shard ``1/1``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
from collections.abc import Sequence

from fa2_verify.core.errors import UsageError
from fa2_verify.core.runner_shard import WHOLE_RUN, RunnerShard
from fa2_verify.core.user_json import read_json
from fa2_verify.core.outputs import write_text_atomic

#: Allure's description of the environment of a run, one ``key=value`` per line (Java properties).
RUN_FILE = "environment.properties"
#: The keys that must agree between the shards of one run.
SAME_RUN = ("kernel", "device", "profile", "dtypes")
SHARD_KEY = "shard"


def write_run(directory: pathlib.Path, run: dict[str, str]) -> pathlib.Path:
    """Describe the run whose results ``directory`` holds (``run``: :data:`SAME_RUN` and :data:`SHARD_KEY`),
    replacing an older description."""
    text = "".join(f"{key}={_escaped(value)}\n" for key, value in run.items())
    return write_text_atomic(directory / RUN_FILE, text, overwrite=True, flag="--alluredir")


def _escaped(value: str) -> str:
    """``value`` as a Java properties value: backslashes, line breaks and a leading space escaped."""
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + value if value.startswith(" ") else value


def _unescaped(value: str) -> str:
    out, chars = [], iter(value)
    for char in chars:
        if char == "\\":
            char = {"n": "\n", "r": "\r"}.get(escaped := next(chars, ""), escaped)
        out.append(char)
    return "".join(out)


def read_run(directory: pathlib.Path) -> dict[str, str] | None:
    """The description of the run whose results ``directory`` holds (None without one); a one-line
    :class:`UsageError` when it lacks a key or names no shard."""
    path = directory / RUN_FILE
    if not path.is_file():
        return None
    run = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, separator, value = line.partition("=")
        if separator and not line.lstrip().startswith(("#", "!")):
            run[key.strip()] = _unescaped(value)
    missing = [key for key in (*SAME_RUN, SHARD_KEY) if key not in run]
    if missing:
        raise UsageError(f"results={directory}: {RUN_FILE} names no {', '.join(missing)}: it was not written "
                         "by a property-suite run of fa2-verify")
    try:
        RunnerShard.parse(run[SHARD_KEY])
    except ValueError as exc:
        raise UsageError(f"results={directory}: {RUN_FILE}: shard={run[SHARD_KEY]} {exc}") from None
    return run


def require_results(directory: pathlib.Path) -> None:
    """A one-line :class:`UsageError` unless ``directory`` holds Allure results (``*-result.json``)."""
    if directory.is_dir() and any(directory.glob("*-result.json")):
        return
    problem = "holds no Allure results (*-result.json)" if directory.is_dir() else (
        "is not a directory" if directory.exists() else "does not exist"
    )
    raise UsageError(f"results={directory} {problem}: run pytest with --alluredir {directory}")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Directories checked to be one complete run (:func:`plan`), and that run's description (None for a
    single directory that has none)."""

    directories: tuple[pathlib.Path, ...]
    run: dict[str, str] | None


def plan(directories: Sequence[pathlib.Path]) -> Plan:
    """Check that ``directories`` hold the results of one complete run (see the module); the first problem
    is a one-line :class:`UsageError`."""
    directories = tuple(pathlib.Path(directory) for directory in directories)
    if not directories:
        raise UsageError("no results directory given: name the allure-results of each shard")
    for directory in directories:
        require_results(directory)
    read = [read_run(directory) for directory in directories]
    if read == [None]:
        return Plan(directories, None)
    runs: list[dict[str, str]] = []
    for directory, run in zip(directories, read):
        if run is None:
            raise UsageError(f"results={directory} has no {RUN_FILE}: nothing says which run's shard it is "
                             "(run the property suite with --fa2-kernel and --alluredir)")
        runs.append(run)
    _require_one_run(directories, runs)
    _require_every_shard_once(directories, [RunnerShard.parse(run[SHARD_KEY]) for run in runs])
    _require_tests_once(directories)
    return Plan(directories, {key: runs[0][key] for key in SAME_RUN})


def _require_one_run(directories: tuple[pathlib.Path, ...], runs: list[dict[str, str]]) -> None:
    for directory, run in zip(directories[1:], runs[1:]):
        for key in SAME_RUN:
            if run[key] != runs[0][key]:
                raise UsageError(
                    f"results={directory} is a run of {key} {run[key]!r} and results={directories[0]} of "
                    f"{key} {runs[0][key]!r}: the shards of one run share kernel, device, profile and dtypes"
                )


def _require_every_shard_once(directories: tuple[pathlib.Path, ...], shards: list[RunnerShard]) -> None:
    first: dict[RunnerShard, pathlib.Path] = {}
    for directory, shard in zip(directories, shards):
        if shard.count != shards[0].count:
            raise UsageError(f"results={directory} is shard {shard} and results={directories[0]} shard {shards[0]}: "
                             "the shards of one run split it the same way")
        if shard in first:
            raise UsageError(f"results={first[shard]} and results={directory} are both shard {shard}: "
                             "give each shard once")
        first[shard] = directory
    missing = [str(RunnerShard(index, shards[0].count)) for index in range(1, shards[0].count + 1)
               if RunnerShard(index, shards[0].count) not in first]
    if missing:
        raise UsageError(f"shard {', '.join(missing)} missing (given: {', '.join(str(shard) for shard in shards)}): "
                         "a report of part of the run would look whole; give the results of every shard")


def result_tests(directory: pathlib.Path) -> set[str]:
    """The tests ``directory``'s results are of: each result's ``fullName`` (else its ``name``)."""
    names: set[str] = set()
    for path in sorted(directory.glob("*-result.json")):
        result = read_json(path, str(path))
        name = result.get("fullName", result.get("name")) if isinstance(result, dict) else None
        if not isinstance(name, str):
            raise UsageError(f"{path}: not an Allure result (no fullName or name)")
        names.add(name)
    return names


def _require_tests_once(directories: tuple[pathlib.Path, ...]) -> None:
    seen: dict[str, pathlib.Path] = {}
    for directory in directories:
        for name in sorted(result_tests(directory)):
            if name in seen:
                raise UsageError(f"test {name} is in results={seen[name]} and results={directory}: a test "
                                 "belongs to one shard; give the results of each shard once")
            seen[name] = directory


def write_merged(merge: Plan, out: pathlib.Path) -> None:
    """Copy every file of ``merge``'s directories into ``out`` (a new directory) and describe it as the whole
    run; a one-line :class:`UsageError` for two different files of the same name."""
    out.mkdir(parents=True)
    origin: dict[str, pathlib.Path] = {}
    for directory in merge.directories:
        for path in sorted(directory.iterdir()):
            if path.name == RUN_FILE or not path.is_file():
                continue
            target = out / path.name
            if path.name in origin:
                if target.read_bytes() != path.read_bytes():
                    raise UsageError(f"results={origin[path.name]} and results={directory} both hold a different "
                                     f"{path.name}: the merged results can keep only one")
                continue
            shutil.copyfile(path, target)
            origin[path.name] = directory
    if merge.run is not None:
        write_run(out, {**merge.run, SHARD_KEY: str(WHOLE_RUN), "merged_shards": str(len(merge.directories))})
