"""The distribution installs one top-level import package, named after itself (PEP 8, PyPA packaging).

Generic top-level names (``kernels``, ``verify``, ``golden``) collide with
other distributions: Hugging Face's ``kernels`` installs an import package
of that name, and two distributions writing the same folder of site-packages
overwrite each other.  The wheel is built from the source tree (no build
isolation, so no download) and its file list is read.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_wheel_holds_exactly_one_top_level_package(tmp_path) -> None:
    """Every file of the wheel lies under ``fa2_verify/`` or its ``.dist-info`` folder."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("fa2_verify-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"fa2_verify"}


def test_the_type_check_covers_the_package_from_the_pyproject_configuration() -> None:
    """``.ci/run`` runs ``python -m mypy`` bare, so what it checks is ``[tool.mypy]``: the whole package, at the
    oldest Python the distribution supports, with mypy installed by the ``test`` extra."""
    tomllib = __import__("tomllib") if sys.version_info >= (3, 11) else __import__("tomli")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    config = pyproject["tool"]["mypy"]
    assert config["packages"] == ["fa2_verify"]
    assert pyproject["project"]["requires-python"] == f">={config['python_version']}"
    assert any(requirement.startswith("mypy") for requirement in pyproject["project"]["optional-dependencies"]["test"])
    assert ".venv/bin/python -m mypy\n" in (ROOT / ".ci" / "run").read_text()
