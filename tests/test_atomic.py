"""core/outputs.py: reports and baselines take the mode the umask gives, and an unwritable path is refused
up front, naming the flag and the reason."""

from __future__ import annotations

import os
import stat

import pytest

from fa2_verify.core.errors import ReportError
from fa2_verify.core.outputs import check_outputs, check_writable, write_text_atomic


@pytest.fixture
def umask():
    """Set the process umask for one test, restoring it afterwards."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
@pytest.mark.parametrize("overwrite", [False, True])
def test_written_file_takes_the_mode_of_the_umask(tmp_path, umask, mask, mode, overwrite):
    umask(mask)
    target = write_text_atomic(tmp_path / "report.json", "{}", overwrite=overwrite, flag="--out")
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


@pytest.mark.parametrize(
    "relative, overwrite, message",
    [
        ("existing.json", False, "--out={tmp}/existing.json exists: pass --overwrite"),
        ("directory", True, "--out={tmp}/directory is a directory: name a file"),
        ("a-file/report.json", True, "--out={tmp}/a-file/report.json cannot be written: {tmp}/a-file is not a directory"),
        ("a-file/deeper/report.json", True, "cannot be written: {tmp}/a-file is not a directory"),
    ],
    ids=["exists", "is-a-directory", "parent-is-a-file", "ancestor-is-a-file"],
)
def test_unwritable_path_is_refused_in_one_line(tmp_path, relative, overwrite, message):
    (tmp_path / "existing.json").write_text("old")
    (tmp_path / "directory").mkdir()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ReportError) as info:
        check_writable(tmp_path / relative, overwrite=overwrite, flag="--out")
    assert message.format(tmp=tmp_path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ReportError):
        write_text_atomic(tmp_path / relative, "new", overwrite=overwrite, flag="--out")
    assert (tmp_path / "existing.json").read_text() == "old"


def test_a_missing_directory_is_created(tmp_path):
    target = check_writable(tmp_path / "new" / "deeper" / "report.json", overwrite=False, flag="--report")
    assert not target.parent.exists()
    assert write_text_atomic(target, "text", overwrite=False, flag="--report").read_text() == "text"


def test_two_outputs_naming_one_file_are_refused_even_with_overwrite(tmp_path):
    """The second write would replace the first: --overwrite allows replacing old files, not a fresh output."""
    (tmp_path / "sub").mkdir()
    with pytest.raises(ReportError) as info:
        check_outputs(
            {"--report": tmp_path / "r.json", "--out": None, "--markdown": tmp_path / "sub" / ".." / "r.json"},
            overwrite=True,
        )
    assert str(info.value) == (
        f"--report={tmp_path}/r.json and --markdown={tmp_path}/sub/../r.json name the same file: choose different paths"
    )
    check_outputs({"--report": tmp_path / "r.json", "--markdown": tmp_path / "r.md"}, overwrite=False)


@pytest.mark.parametrize("link", ["same-path", "symlink", "hard-link"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_that_is_an_input_is_refused_even_with_overwrite(tmp_path, link, overwrite):
    """Replacing a file the command reads destroys it; --overwrite asks to replace old outputs, not inputs."""
    source = tmp_path / "baseline.json"
    source.write_text("{}")
    output = {"same-path": tmp_path / "." / "baseline.json", "symlink": tmp_path / "link.json",
              "hard-link": tmp_path / "hard.json"}[link]
    if link == "symlink":
        output.symlink_to(source)
    elif link == "hard-link":
        os.link(source, output)
    with pytest.raises(ReportError) as info:
        check_outputs({"--markdown": output}, overwrite=overwrite, inputs={"--corpus": None, "--baseline": source})
    assert str(info.value) == (
        f"--markdown={output} is --baseline={source}, which this command reads: writing it would destroy the input, "
        "with or without --overwrite; choose another --markdown"
    )
    check_outputs({"--markdown": tmp_path / "gate.md"}, overwrite=overwrite, inputs={"--baseline": source})


@pytest.mark.parametrize("where", ["loop", "loop/report.json"])
def test_a_symlink_loop_is_refused_up_front_in_one_line(tmp_path, where):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ReportError) as info:
        check_outputs({"--out": tmp_path / where}, overwrite=True)
    assert str(info.value) == f"--out={tmp_path / where} is a symlink loop: choose another path"
