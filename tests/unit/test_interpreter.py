"""What of the host an interpreter needs in a sandbox: venv detection, binds, reach."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tooljaild.sandbox import interpreter
from tooljaild.sandbox.interpreter import Interpreter, InterpreterError


def _fake_venv(root: Path, home: str = "/usr/bin") -> Path:
    """A venv as `python -m venv` lays it out: bin/python a symlink to its base."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {home}\nversion = 3.11.2\n")
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    return root / "bin" / "python"


def test_a_venv_is_exec_d_as_configured_not_through_its_symlink(tmp_path: Path) -> None:
    python = _fake_venv(tmp_path / "venv")
    found = interpreter.inspect(str(python))
    assert found.path == str(python)
    assert found.binary == os.path.realpath("/usr/bin/python3")
    assert found.venv == str(tmp_path / "venv")
    assert found.venv_version == "3.11.2"
    assert found.bind_dirs() == [str(tmp_path / "venv")], "/usr is bound anyway"


def test_a_plain_interpreter_is_its_real_binary(tmp_path: Path) -> None:
    link = tmp_path / "py"
    link.symlink_to("/usr/bin/python3")
    found = interpreter.inspect(str(link))
    assert found.path == found.binary == os.path.realpath("/usr/bin/python3")
    assert found.venv is None and found.bind_dirs() == []


def test_binds_are_the_venv_and_its_base_prefix_outside_usr_without_nesting() -> None:
    pyenv = Interpreter(
        path="/opt/v/bin/python",
        binary="/root/.pyenv/versions/3.11.7/bin/python3.11",
        venv="/opt/v",
        base_prefix="/root/.pyenv/versions/3.11.7",
    )
    assert pyenv.bind_dirs() == ["/opt/v", "/root/.pyenv/versions/3.11.7"]
    copies = Interpreter(path="/opt/v/bin/python", binary="/opt/v/bin/python", venv="/opt/v")
    assert copies.bind_dirs() == ["/opt/v"]


def test_missing_interpreters_and_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(InterpreterError, match="no such file"):
        interpreter.inspect(str(tmp_path / "nope" / "bin" / "python"))
    python = _fake_venv(tmp_path / "venv")
    with pytest.raises(
        InterpreterError, match=r"is a directory: a virtualenv; give its .*/bin/python"
    ):
        interpreter.inspect(str(tmp_path / "venv"))
    gone = _fake_venv(tmp_path / "gone", home=str(tmp_path / "removed" / "bin"))
    with pytest.raises(InterpreterError, match="which is gone: recreate the venv"):
        interpreter.inspect(str(gone))
    assert python.exists()


def test_unreachable_names_the_component_that_stops_the_uid(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    target = locked / "file"
    target.write_text("x")
    uid = os.geteuid() + 4242
    why = interpreter.unreachable(str(target), os.R_OK, uid, frozenset({uid}))
    assert why is not None and why.startswith(f"{locked} (drwx------ ")
    assert why.endswith("lacks search (x) for others")
    locked.chmod(0o755)
    target.chmod(0o600)
    why = interpreter.unreachable(str(target), os.R_OK, uid, frozenset({uid}))
    assert why is not None and why.endswith("lacks read (r) for others")
    target.chmod(0o644)
    assert interpreter.unreachable(str(target), os.R_OK, uid, frozenset({uid})) is None
