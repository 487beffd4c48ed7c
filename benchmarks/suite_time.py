"""Where the property suite's time goes: per property, compile, kernel, golden, comparison, inputs and Hypothesis.

    python benchmarks/suite_time.py --kernel triton --device cuda --profile ci --workers 12 \\
        --passes cold,warm --out results/suite-time [--triton-cache DIR] [--package-root DIR] [-- PYTEST ARGS]

Runs the property suite (``pytest --pyargs fa2_verify.properties``, as
``ci/properties.sh`` does) once per pass, with ``--workers`` pytest-xdist
workers (0: no xdist) and the timing plugin :mod:`benchmarks.suite_phases`
loaded in each, then prints and writes (``OUT/table.md``, ``OUT/times.json``)
one table per pass (:mod:`benchmarks.suite_table`) and, last, each pass's
wall-clock: the number the suite's time targets are about.

Passes (``--passes``, in the order given):

* ``cold``: Triton's cache (``TRITON_CACHE_DIR``) empty: ``OUT/triton-cache``,
  emptied first, or ``--triton-cache DIR``, which must then be empty or absent;
* ``warm``: the same cache again, as the passes before left it (a ``--triton-cache``
  filled by a warm-up, for ``--passes warm``);
* ``cold-known``: Triton's cache emptied again, but the test durations the
  passes before recorded kept: a kernel change's CI run, whose variants are
  all new but whose runner restored the last runs' durations, which the
  plugin orders the tests on (:mod:`fa2_verify.properties.schedule`).

Every pass starts from an empty golden cache (``FA2_VERIFY_GOLDEN_CACHE``) and
example database of its own (``OUT/<pass>/``), as on a fresh CI runner.  The
passes share pytest's cache (``OUT/pytest-cache``, where the plugin records
each test's duration), which the ``cold`` pass empties first: it runs as a
first run, with no durations known.  So the passes differ only in Triton's
cache and in the durations known.  ``--package-root DIR`` times another
copy of the package (``DIR/fa2_verify``, e.g. ``git archive main fa2_verify |
tar -x -C DIR``) first on ``PYTHONPATH``, so before and after a change are
measured in one session on one machine; the table says which package ran.
Arguments after ``--`` go to pytest (``-k``, ``--hypothesis-seed``).
Each pass's pytest output is in ``OUT/<pass>/pytest.log``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a script: the repository root, so that `benchmarks` imports
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks import suite_table  # noqa: E402
from fa2_verify.core.errors import Fa2VerifyError, UsageError  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
PASSES = ("cold", "warm", "cold-known")
PROPERTY_PLUGIN = "fa2_verify.properties.plugin"


def parse(argv: list[str]) -> argparse.Namespace:
    """The script's options; everything after the first ``--`` is kept in ``pytest_args``."""
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="suite_time.py", description=__doc__.split("\n")[0])
    parser.add_argument("--kernel", default="triton", help="kernel target (default triton)")
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N (default cuda)")
    parser.add_argument("--profile", default="ci", help="property-suite profile (default ci)")
    parser.add_argument("--workers", type=int, default=12, help="pytest-xdist workers, 0 for none (default 12)")
    parser.add_argument("--passes", default="cold,warm",
                        help="comma-separated, from cold, warm and cold-known (default cold,warm)")
    parser.add_argument("--triton-cache", default=None, help="Triton cache directory (default OUT/triton-cache)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop each pass after SECONDS (SIGINT, as lab/device/device-scale.sh does: the tests finished "
                             "by then keep their records, the table says the pass was stopped)")
    parser.add_argument("--package-root", default=None, help="directory holding the fa2_verify package to time")
    parser.add_argument("--out", required=True, help="output directory (its table.md, times.json and pass folders "
                        "are replaced)")
    args = parser.parse_args(ours)
    args.pytest_args = pytest_args
    args.passes = tuple(name for name in args.passes.split(",") if name)
    unknown = [name for name in args.passes if name not in PASSES]
    if unknown or not args.passes:
        raise UsageError(f"--passes={','.join(args.passes)}: use cold, warm and cold-known, comma-separated")
    if args.workers < 0:
        raise UsageError(f"--workers={args.workers}: use 0 (no xdist) or more")
    if args.package_root is not None:
        root = pathlib.Path(args.package_root).resolve()
        if not (root / "fa2_verify" / "__init__.py").is_file():
            raise UsageError(f"--package-root={args.package_root}: holds no fa2_verify package")
        if (root / "benchmarks").exists():
            raise UsageError(f"--package-root={args.package_root}: holds a benchmarks/ that would shadow this "
                             "script's timing plugin: extract only fa2_verify there")
        args.package_root = root
    return args


def _entry_point_loads_plugin() -> bool:
    """Whether an installed fa2-verify loads the property plugin by itself (naming it again with -p is an error)."""
    return any(entry.value == PROPERTY_PLUGIN for entry in importlib.metadata.entry_points(group="pytest11"))


def pytest_command(args: argparse.Namespace, records: pathlib.Path, examples: pathlib.Path,
                   pytest_cache: pathlib.Path) -> list[str]:
    """The pytest invocation of one pass (the suite as ``ci/properties.sh`` runs it, plus the timing plugin)."""
    command = [sys.executable, "-m", "pytest", "--pyargs", "fa2_verify.properties", "-q", "-o", f"cache_dir={pytest_cache}"]
    if not _entry_point_loads_plugin():
        command += ["-p", PROPERTY_PLUGIN]
    command += ["-p", "benchmarks.suite_phases", "--suite-time-dir", str(records)]
    if args.workers:
        command += ["-n", str(args.workers)]
    command += ["--fa2-kernel", args.kernel, "--fa2-device", args.device, "--fa2-profile", args.profile,
                "--fa2-examples-dir", str(examples), *args.pytest_args]  # fmt: skip
    return command


def _fresh(directory: pathlib.Path) -> pathlib.Path:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def triton_cache(args: argparse.Namespace, out: pathlib.Path, name: str) -> pathlib.Path:
    """The pass's Triton cache: a cold pass (``cold``, ``cold-known``) needs it empty (emptying only the
    script's own default)."""
    if args.triton_cache is None:
        cache = out / "triton-cache"
        return cache if name == "warm" else _fresh(cache)
    cache = pathlib.Path(args.triton_cache).resolve()
    if name != "warm" and cache.exists() and any(cache.iterdir()):
        raise UsageError(f"--triton-cache={args.triton_cache}: the {name} pass needs an empty cache; "
                         "use an empty directory or --passes warm")
    return cache


def _run_limited(command: list[str], folder: pathlib.Path, env: dict, log, limit: float | None) -> tuple[int, bool]:
    """pytest's exit status, and whether ``limit`` seconds stopped it (SIGINT, then SIGKILL 30 s later)."""
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        return process.wait(timeout=limit), False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=30), True
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(), True


def run_pass(args: argparse.Namespace, out: pathlib.Path, name: str) -> dict:
    """One pass of the suite: its wall-clock, pytest's exit status and the aggregated records."""
    folder = _fresh(out / name)
    records = folder / "records"
    cache = triton_cache(args, out, name)
    cache.mkdir(parents=True, exist_ok=True)
    pytest_cache = _fresh(out / "pytest-cache") if name == "cold" else out / "pytest-cache"
    paths = [str(args.package_root)] if args.package_root else []
    paths += [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), FA2_VERIFY_GOLDEN_CACHE=str(folder / "golden-cache"),
               PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")  # fmt: skip
    command = pytest_command(args, records, folder / "examples", pytest_cache)
    print(f"== {name} pass: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    with (folder / "pytest.log").open("w", encoding="utf-8") as log:
        # In the pass's folder: `python -m` puts the working directory first on sys.path (the workers inherit it),
        # where the repository's own fa2_verify would shadow --package-root's.
        status, stopped = _run_limited(command, folder, env, log, args.time_limit)
    wall = time.perf_counter() - started
    tail = (folder / "pytest.log").read_text(encoding="utf-8", errors="replace").splitlines()[-3:]
    print("\n".join(f"   {line}" for line in tail), flush=True)
    if not records.exists():
        raise UsageError(f"{name} pass: pytest exited {status} before any test ran: see {folder / 'pytest.log'}")
    return {"name": name, "wall_seconds": wall, "exit_status": status, "stopped_at_limit": stopped,
            "triton_cache": str(cache),
            **suite_table.aggregate(suite_table.read_records(records))}  # fmt: skip


def _stopped(result: dict) -> str:
    return ", stopped by --time-limit: the tests it had not finished are missing" if result.get("stopped_at_limit") else ""


def report(args: argparse.Namespace, passes: list[dict]) -> str:
    """The Markdown of every pass's table, then the wall-clock lines."""
    sections = [f"Kernel `{args.kernel}`, device `{args.device}`, profile `{args.profile}`, {args.workers} workers."]
    for result in passes:
        missing = f"; not timed (absent in this package): {', '.join(result['missing'])}" if result["missing"] else ""
        heading = f"### {result['name']} pass: {result['wall_seconds']:.1f} s wall-clock"
        sections.append(
            f"{heading} (pytest exit {result['exit_status']}{_stopped(result)})"
            f"\n\npackage: {', '.join(result['packages'])}{missing}\n\n{suite_table.markdown(result)}"
        )
    sections.append("\n".join(
        f"{result['name']}: {result['wall_seconds']:.1f} s wall-clock, {len(result['tests'])} tests, "
        f"{result['total']['examples']} examples, pytest exit {result['exit_status']}{_stopped(result)}"
        for result in passes
    ))  # fmt: skip
    return "\n\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        out = pathlib.Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        passes = [run_pass(args, out, name) for name in args.passes]
    except Fa2VerifyError as exc:
        print(f"suite_time.py: error: {exc}", file=sys.stderr)
        return 2
    text = report(args, passes)
    print(text, end="")
    (out / "table.md").write_text(text, encoding="utf-8")
    config = {key: str(value) if isinstance(value, pathlib.Path) else value for key, value in vars(args).items()}
    (out / "times.json").write_text(json.dumps({"config": config, "passes": passes}, indent=1), encoding="utf-8")
    return 0 if all(result["exit_status"] == 0 for result in passes) else 1


if __name__ == "__main__":
    sys.exit(main())
