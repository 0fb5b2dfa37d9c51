"""`_workspace.run` on a real directory: every op, every bad input, every escape.

The ops run inside sandboxes; here they run on a temporary directory of the
host, so a symlink that escaped would read a real host file: the refusals are
tested where they matter most.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from tooljaild.runner import _workspace, _workspace_read, _workspace_write
from tooljaild.runner._workspace import WorkspaceError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def run(root: Path, op: str, quota: int = 0, **args: Any) -> Any:
    return _workspace.run(op, args, str(root), quota)


def fails(root: Path, op: str, type_: str, quota: int = 0, **args: Any) -> str:
    with pytest.raises(WorkspaceError) as info:
        run(root, op, quota, **args)
    assert info.value.type == type_, info.value.message
    return info.value.message


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize("op", ["read_file", "write_file", "delete_file", "ls", "grep"])
@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("../../etc/passwd", "leaves the workspace"),
        ("a/../../outside.txt", "leaves the workspace"),
        ("..", "leaves the workspace"),
        ("/etc/passwd", "is absolute"),
    ],
)
def test_paths_outside_are_refused_naming_them(root: Path, op: str, path: str, says: str) -> None:
    args: dict[str, Any] = {"path": path}
    if op == "write_file":
        args["content"] = "x"
    if op == "grep":
        args["pattern"] = "root"
    message = fails(root, op, "InvalidPathError", **args)
    assert repr(path) in message and says in message
    assert not (root.parent / "outside.txt").exists()


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    """A file of the host outside the workspace, as the daemon's state would be."""
    state = tmp_path / "state"
    state.mkdir()
    secret = state / "journal.sqlite"
    secret.write_text("host secret\n")
    return secret


@pytest.mark.parametrize("target", ["/etc/shadow", "/etc/passwd", "STATE_FILE", "STATE_DIR"])
def test_symlinks_out_of_the_workspace_are_refused(
    root: Path, host_secret: Path, target: str
) -> None:
    real = {"STATE_FILE": str(host_secret), "STATE_DIR": str(host_secret.parent)}.get(
        target, target
    )
    (root / "link").symlink_to(real)
    for op, args in [
        ("read_file", {"path": "link"}),
        ("read_file", {"path": "link/journal.sqlite"}),
        ("download_chunk", {"path": "link"}),
        ("write_file", {"path": "link", "content": "pwned"}),
        ("write_file", {"path": "link/new.txt", "content": "pwned"}),
        ("edit_file", {"path": "link", "old_string": "host", "new_string": "x"}),
        ("insert_file", {"path": "link", "offset": 0, "content": "x"}),
        ("ls", {"path": "link"}),
        ("grep", {"pattern": "secret", "path": "link"}),
        ("glob", {"pattern": "*", "path": "link"}),
        ("clear_files", {"path": "link"}),
        ("move_file", {"path": "x", "new_path": "link/moved"}),
    ]:
        message = fails(root, op, "InvalidPathError", **args)
        assert "outside the workspace" in message, (op, message)
        assert "host secret" not in message and "root:" not in message
    assert host_secret.read_text() == "host secret\n"
    assert not (host_secret.parent / "new.txt").exists()


def test_a_dangling_symlink_pointing_out_is_not_written_through(root: Path, tmp_path: Path) -> None:
    (root / "link").symlink_to(tmp_path / "created-outside.txt")
    fails(root, "write_file", "InvalidPathError", path="link", content="x")
    assert not (tmp_path / "created-outside.txt").exists()


def test_symlinks_inside_the_workspace_are_followed(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("inside\n")
    (root / "alias").symlink_to("d")
    assert "inside" in run(root, "read_file", path="alias/f.txt")["content"]


def test_a_symlink_itself_is_deleted_and_moved_never_its_target(
    root: Path, host_secret: Path
) -> None:
    (root / "link").symlink_to(host_secret)
    assert run(root, "move_file", path="link", new_path="moved") == {
        "path": "link",
        "new_path": "moved",
    }
    assert run(root, "delete_file", path="moved")["deleted"] == "symlink"
    assert host_secret.read_text() == "host secret\n"


def test_clear_files_removes_links_not_what_they_point_to(root: Path, host_secret: Path) -> None:
    (root / "dirlink").symlink_to(host_secret.parent)
    (root / "filelink").symlink_to(host_secret)
    (root / "sub").mkdir()
    (root / "sub" / "a.txt").write_text("a")
    got = run(root, "clear_files")
    assert got == {"path": ".", "removed_files": 3, "removed_directories": 1}
    assert list(root.iterdir()) == [] and host_secret.read_text() == "host secret\n"


def test_glob_and_grep_do_not_walk_into_linked_directories(root: Path, host_secret: Path) -> None:
    (root / "dirlink").symlink_to(host_secret.parent)
    assert run(root, "glob", pattern="**/*")["matches"] == ["dirlink"]
    assert run(root, "grep", pattern="secret")["matches"] == []


@pytest.mark.parametrize("bad", ["", ".", "a/.."])
def test_the_root_itself_is_no_file(root: Path, bad: str) -> None:
    assert "workspace itself" in fails(root, "delete_file", "InvalidPathError", path=bad)
    assert "workspace itself" in fails(root, "read_file", "InvalidPathError", path=bad)


def test_a_nul_in_a_path_is_refused(root: Path) -> None:
    fails(root, "read_file", "InvalidPathError", path="a\0b")


# --------------------------------------------------------------------------- read_file


def test_read_file_numbers_lines(root: Path) -> None:
    (root / "f.txt").write_text("one\ntwo\nthree")
    got = run(root, "read_file", path="f.txt")
    assert got == {
        "path": "f.txt",
        "content": "     1\tone\n     2\ttwo\n     3\tthree\n",
        "total_lines": 3,
        "lines": "1-3",
    }


def test_read_file_pages_with_offset_and_limit(root: Path) -> None:
    (root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    got = run(root, "read_file", path="f.txt", offset=3, limit=2)
    assert got["content"] == "     4\tline 4\n     5\tline 5\n"
    assert got["lines"] == "4-5" and got["total_lines"] == 10
    assert "5 more lines left" in got["note"] and "offset=5" in got["note"]
    past = run(root, "read_file", path="f.txt", offset=50)
    assert past["content"] == "" and "past the end: the file has 10 lines" in past["note"]


def test_read_file_defaults_to_2000_lines(root: Path) -> None:
    (root / "f.txt").write_text("x\n" * 2500)
    got = run(root, "read_file", path="f.txt")
    assert got["lines"] == "1-2000" and "500 more lines left" in got["note"]
    assert "offset=2000" in got["note"]


def test_read_file_cuts_long_lines_with_a_mark(root: Path) -> None:
    (root / "f.txt").write_text("a" * 5000 + "\nshort\n" + "b" * 100_000)
    got = run(root, "read_file", path="f.txt")
    lines = got["content"].splitlines()
    assert lines[0] == "     1\t" + "a" * 2000 + "... [line cut: 3000 more bytes]"
    assert lines[1] == "     2\tshort"
    assert lines[2].endswith("... [line cut: 98000 more bytes]")
    assert got["total_lines"] == 3


def test_read_file_caps_the_bytes_it_returns(root: Path) -> None:
    (root / "f.txt").write_text(("y" * 1000 + "\n") * 1000)  # ~1 MB in 1000 lines
    got = run(root, "read_file", path="f.txt")
    assert len(got["content"].encode()) <= _workspace_read.MAX_READ_BYTES
    last = int(got["lines"].split("-")[1])
    assert 200 < last < 1000
    assert "256 KiB cap" in got["note"] and f"offset={last}" in got["note"]
    assert got["total_lines"] == 1000


def test_read_file_of_an_empty_file(root: Path) -> None:
    (root / "e.txt").write_text("")
    got = run(root, "read_file", path="e.txt")
    assert got["content"] == "" and got["note"] == "The file is empty."


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 20, "PNG image"),
        (b"%PDF-1.7\n\0\0", "PDF document"),
        (b"PK\x03\x04\0\0", "ZIP archive"),
        (b"\x7fELF\x02\x01\0", "ELF"),
        (b"\x80\x04\x95\0\0", "Python pickle"),
        (b"\x00\x01\x02junk", "unknown binary data"),
        (b"\xff\xfeh\x00i\x00", "UTF-16"),
        (b"caf\xe9 latin-1 text", "unknown binary data"),
    ],
)
def test_binary_files_are_described_not_dumped(root: Path, data: bytes, kind: str) -> None:
    (root / "blob").write_bytes(data)
    got = run(root, "read_file", path="blob")
    assert got["binary"] is True and got["size_bytes"] == len(data)
    assert kind in got["type"] and "content" not in got
    assert "not UTF-8 text" in got["note"]


def test_utf8_cut_at_the_sniff_boundary_is_still_text(root: Path) -> None:
    text = "a" * (_workspace_read.SNIFF_BYTES - 1) + "é\n"
    (root / "t.txt").write_text(text)
    assert "binary" not in run(root, "read_file", path="t.txt")


def test_read_file_of_a_directory_or_missing_file(root: Path) -> None:
    (root / "d").mkdir()
    assert "is a directory" in fails(root, "read_file", "InvalidPathError", path="d")
    message = fails(root, "read_file", "FileNotFoundError", path="nope.txt")
    assert "'nope.txt'" in message


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"path": "f", "offset": -1}, "offset must be at least 0"),
        ({"path": "f", "limit": 0}, "limit must be at least 1"),
        ({"path": "f", "limit": True}, "limit must be an integer"),
        ({"path": 3}, "path must be of type str, not int"),
        ({}, "missing argument 'path'"),
        ({"path": "f", "nope": 1}, "read_file takes no argument 'nope'"),
    ],
)
def test_bad_arguments_are_named(root: Path, args: dict[str, Any], says: str) -> None:
    (root / "f").write_text("x\n")
    assert says in fails(root, "read_file", "InvalidArgumentError", **args)


def test_an_unknown_op_is_refused(root: Path) -> None:
    assert "unknown workspace op 'rm_rf'" in fails(root, "rm_rf", "InvalidArgumentError")


# --------------------------------------------------------------------------- writes


def test_write_file_creates_parents_and_replaces(root: Path) -> None:
    got = run(root, "write_file", path="a/b/c.txt", content="hi\nthere")
    assert got == {"path": "a/b/c.txt", "created": True, "size_bytes": 8, "lines": 2}
    assert (root / "a/b/c.txt").read_text() == "hi\nthere"
    assert run(root, "write_file", path="a/b/c.txt", content="")["created"] is False
    assert (root / "a/b/c.txt").read_text() == ""
    assert sorted(p.name for p in (root / "a/b").iterdir()) == ["c.txt"]  # no temp file left


def test_write_file_keeps_an_existing_files_mode(root: Path) -> None:
    (root / "run.sh").write_text("echo 1\n")
    (root / "run.sh").chmod(0o755)
    run(root, "edit_file", path="run.sh", old_string="1", new_string="2")
    assert (root / "run.sh").stat().st_mode & 0o777 == 0o755


def test_write_file_refuses_a_directory_or_a_file_as_a_parent(root: Path) -> None:
    (root / "d").mkdir()
    (root / "f").write_text("x")
    assert "is a directory" in fails(root, "write_file", "InvalidPathError", path="d", content="")
    fails(root, "write_file", "InvalidPathError", path="f/g.txt", content="")


def test_writes_past_the_quota_are_refused_before_writing(root: Path) -> None:
    (root / "big").write_bytes(b"x" * 600)
    message = fails(root, "write_file", "WorkspaceFullError", 1000, path="n.txt", content="y" * 500)
    assert "quota of 1000 bytes" in message and "'n.txt'" in message
    assert not (root / "n.txt").exists()
    # Replacing a file counts what it frees.
    run(root, "write_file", 1000, path="big", content="z" * 900)
    fails(root, "edit_file", "WorkspaceFullError", 1000, path="big", old_string="z" * 900,
          new_string="w" * 1200)  # fmt: skip
    assert (root / "big").read_text() == "z" * 900
    fails(root, "insert_file", "WorkspaceFullError", 1000, path="big", offset=0, content="q" * 200)


@pytest.mark.parametrize("code", ["ENOSPC", "EDQUOT", "EFBIG"])
def test_a_full_disk_is_workspace_full(
    root: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    import errno

    def full(fd: int, data: Any) -> int:
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    (root / "f.txt").write_text("old")
    monkeypatch.setattr(_workspace_write.os, "write", full)
    fails(root, "write_file", "WorkspaceFullError", path="f.txt", content="new")
    assert (root / "f.txt").read_text() == "old"
    assert [p.name for p in root.iterdir()] == ["f.txt"]  # the temporary file is gone


# --------------------------------------------------------------------------- edit, insert


def test_edit_file_replaces_one_exact_match(root: Path) -> None:
    (root / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    got = run(root, "edit_file", path="f.py", old_string="b = 2", new_string="b = 20\nd = 4")
    assert (root / "f.py").read_text() == "a = 1\nb = 20\nd = 4\nc = 3\n"
    assert got["line"] == 2 and "     3\td = 4" in got["snippet"]


def test_edit_file_says_how_many_matched(root: Path) -> None:
    (root / "f.py").write_text("x = 1\nx = 1\n")
    none = fails(root, "edit_file", "EditMatchError", path="f.py", old_string="y", new_string="z")
    assert "matched 0 times" in none and "read_file" in none
    two = fails(root, "edit_file", "EditMatchError", path="f.py", old_string="x", new_string="z")
    assert "matched 2 times" in two and "unique" in two
    assert (root / "f.py").read_text() == "x = 1\nx = 1\n"


def test_edit_file_bad_strings(root: Path) -> None:
    (root / "f.py").write_text("x\n")
    fails(root, "edit_file", "InvalidArgumentError", path="f.py", old_string="", new_string="y")
    fails(root, "edit_file", "InvalidArgumentError", path="f.py", old_string="x", new_string="x")
    (root / "b.bin").write_bytes(b"\xff\xfe")
    fails(root, "edit_file", "NotTextError", path="b.bin", old_string="x", new_string="y")
    fails(root, "edit_file", "FileNotFoundError", path="no.py", old_string="x", new_string="y")


@pytest.mark.parametrize(
    ("offset", "content", "expected"),
    [
        (0, "top", "top\none\ntwo"),
        (1, "mid\n", "one\nmid\ntwo"),
        (2, "end", "one\ntwo\nend"),
    ],
)
def test_insert_file_at_an_offset(root: Path, offset: int, content: str, expected: str) -> None:
    (root / "f.txt").write_text("one\ntwo")
    got = run(root, "insert_file", path="f.txt", offset=offset, content=content)
    assert (root / "f.txt").read_text() == expected
    assert got["at_line"] == offset + 1 and got["inserted_lines"] == 1


def test_insert_file_past_the_end_says_the_line_count(root: Path) -> None:
    (root / "f.txt").write_text("one\ntwo\n")
    message = fails(
        root, "insert_file", "InvalidArgumentError", path="f.txt", offset=5, content="x"
    )
    assert "has 2 lines" in message and "offset=2" in message
    fails(root, "insert_file", "InvalidArgumentError", path="f.txt", content="x")  # offset required
    fails(root, "insert_file", "FileNotFoundError", path="new.txt", offset=0, content="x")


# --------------------------------------------------------------------------- entries


def test_ls_lists_sorted_entries(root: Path) -> None:
    (root / "b.txt").write_text("12345")
    (root / "a").mkdir()
    (root / "l").symlink_to("b.txt")
    assert run(root, "ls") == {
        "path": ".",
        "entries": [
            {"name": "a/", "type": "directory"},
            {"name": "b.txt", "type": "file", "size_bytes": 5},
            {"name": "l", "type": "symlink", "target": "b.txt"},
        ],
    }
    assert run(root, "ls", path="a")["note"] == "The directory is empty."
    assert run(root, "ls", path="b.txt")["entries"][0]["name"] == "b.txt"
    fails(root, "ls", "FileNotFoundError", path="zz")


def test_ls_is_bounded(root: Path) -> None:
    for i in range(_workspace_read.MAX_ENTRIES + 5):
        (root / f"f{i:05}").touch()
    got = run(root, "ls")
    assert len(got["entries"]) == _workspace_read.MAX_ENTRIES
    assert (
        f"Showing {_workspace_read.MAX_ENTRIES} of {_workspace_read.MAX_ENTRIES + 5}" in got["note"]
    )


def test_delete_file(root: Path) -> None:
    (root / "f").write_text("x")
    (root / "d").mkdir()
    (root / "d" / "g").write_text("y")
    assert run(root, "delete_file", path="f") == {"path": "f", "deleted": "file"}
    message = fails(root, "delete_file", "DirectoryNotEmptyError", path="d")
    assert "holding 1 entry" in message and "clear_files" in message
    run(root, "clear_files", path="d")
    assert run(root, "delete_file", path="d")["deleted"] == "directory"
    fails(root, "delete_file", "FileNotFoundError", path="f")


def test_move_file(root: Path) -> None:
    (root / "a.txt").write_text("a")
    (root / "b.txt").write_text("b")
    assert run(root, "move_file", path="a.txt", new_path="x/y/a2.txt")["new_path"] == "x/y/a2.txt"
    assert (root / "x/y/a2.txt").read_text() == "a" and not (root / "a.txt").exists()
    message = fails(root, "move_file", "FileExistsError", path="b.txt", new_path="x/y/a2.txt")
    assert "never overwrites" in message and (root / "x/y/a2.txt").read_text() == "a"
    fails(root, "move_file", "FileNotFoundError", path="nope", new_path="n2")
    fails(root, "move_file", "InvalidPathError", path="x", new_path="x/y/inside")
    fails(root, "move_file", "InvalidPathError", path="b.txt", new_path="../b.txt")
    run(root, "move_file", path="x", new_path="z")
    assert (root / "z/y/a2.txt").exists()


def test_clear_files_of_a_directory(root: Path) -> None:
    (root / "keep.txt").write_text("k")
    (root / "d/e").mkdir(parents=True)
    (root / "d/e/f").write_text("f")
    (root / "d/g").write_text("g")
    assert run(root, "clear_files", path="d") == {
        "path": "d",
        "removed_files": 2,
        "removed_directories": 1,
    }
    assert list((root / "d").iterdir()) == [] and (root / "keep.txt").exists()
    fails(root, "clear_files", "InvalidPathError", path="keep.txt")
    fails(root, "clear_files", "FileNotFoundError", path="gone")


# --------------------------------------------------------------------------- glob, grep


def test_glob_patterns(root: Path) -> None:
    for name in ["a.py", "b.txt", "src/c.py", "src/deep/d.py", "src/[x].py"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    assert run(root, "glob", pattern="*.py")["matches"] == ["a.py"]
    assert run(root, "glob", pattern="**/*.py")["matches"] == [
        "a.py",
        "src/[x].py",
        "src/c.py",
        "src/deep/d.py",
    ]
    assert run(root, "glob", pattern="*.py", path="src")["matches"] == [
        "src/[x].py",
        "src/c.py",
    ]
    assert run(root, "glob", pattern="src/[cd].py")["matches"] == ["src/c.py"]
    assert run(root, "glob", pattern="src/[!c]*.py")["matches"] == ["src/[x].py"]
    assert run(root, "glob", pattern="src/*")["matches"] == [
        "src/deep/",
        "src/[x].py",
        "src/c.py",
    ]
    assert run(root, "glob", pattern="?.txt")["matches"] == ["b.txt"]
    assert run(root, "glob", pattern="*.md")["note"] == "Nothing matches."
    for bad in ["../*", "/etc/*", "a/../../*"]:
        fails(root, "glob", "InvalidPathError", pattern=bad)


def test_glob_is_bounded(root: Path) -> None:
    for i in range(_workspace_read.MAX_ENTRIES + 1):
        (root / f"{i:05}.txt").touch()
    got = run(root, "glob", pattern="*.txt")
    assert len(got["matches"]) == _workspace_read.MAX_ENTRIES and "Showing the first" in got["note"]


def test_grep_finds_lines_and_skips_binary_files(root: Path) -> None:
    (root / "a.py").write_text("def f():\n    return 1\ndef g():\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.py").write_text("x = f()\n")
    (root / "bin.dat").write_bytes(b"def \0 binary")
    got = run(root, "grep", pattern=r"def \w+|f\(\)")
    assert got["matches"] == ["a.py:1:def f():", "a.py:3:def g():", "sub/b.py:1:x = f()"]
    assert got["files_searched"] == 2
    assert run(root, "grep", pattern="(?i)RETURN", path="a.py")["matches"] == [
        "a.py:2:    return 1"
    ]
    assert run(root, "grep", pattern="x", path="sub")["matches"] == ["sub/b.py:1:x = f()"]
    assert run(root, "grep", pattern="nothing here")["note"] == "No line matches."


def test_line_numbers_agree_across_tools_with_odd_separators(root: Path) -> None:
    """Only a newline ends a line: a form feed or a CR does not shift the numbers."""
    (root / "f.py").write_text("a\x0cb\r\nc\x1cd\ntarget\n", newline="")
    assert run(root, "read_file", path="f.py")["content"].split("\n")[2] == "     3\ttarget"
    assert run(root, "grep", pattern="target")["matches"] == ["f.py:3:target"]
    assert run(root, "edit_file", path="f.py", old_string="target", new_string="t")["line"] == 3
    run(root, "insert_file", path="f.py", offset=2, content="new")
    assert (root / "f.py").read_bytes() == b"a\x0cb\r\nc\x1cd\nnew\nt\n"


def test_grep_refuses_a_bad_regex_clearly(root: Path) -> None:
    message = fails(root, "grep", "PatternError", pattern="def (")
    assert "'def ('" in message and "not a valid Python regular expression" in message
    fails(root, "grep", "FileNotFoundError", pattern="x", path="missing")


def test_grep_is_bounded(root: Path) -> None:
    (root / "many.txt").write_text("hit " + "z" * 900 + "\n" + "hit\n" * 300)
    got = run(root, "grep", pattern="hit")
    assert len(got["matches"]) == _workspace_read.MAX_MATCHES
    assert got["matches"][0].endswith("... [line cut: 404 more bytes]")
    assert f"Showing the first {_workspace_read.MAX_MATCHES} of 301" in got["note"]


# --------------------------------------------------------------------------- files API


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_upload_in_chunks_then_download(root: Path) -> None:
    (root / "up").mkdir()
    (root / "up" / "f.bin").write_bytes(b"old")
    first = run(root, "upload_chunk", path="up/f.bin", upload_id="u1", data_b64=_b64(b"ab"),
                first=True, last=False)  # fmt: skip
    assert first == {"path": "up/f.bin", "upload_id": "u1", "received_bytes": 2}
    assert (root / "up" / "f.bin").read_bytes() == b"old"  # replaced only at the end
    assert (root / "up" / ".tooljail-upload-u1").exists()
    last = run(root, "upload_chunk", path="up/f.bin", upload_id="u1", data_b64=_b64(b"cd\0"),
               first=False, last=True)  # fmt: skip
    assert last == {"path": "up/f.bin", "size_bytes": 5}
    assert (root / "up" / "f.bin").read_bytes() == b"abcd\0"
    assert sorted(p.name for p in (root / "up").iterdir()) == ["f.bin"]
    got = run(root, "download_chunk", path="up/f.bin", offset=1, length=3)
    assert got == {"data_b64": _b64(b"bcd"), "size_bytes": 5, "eof": False}
    got = run(root, "download_chunk", path="up/f.bin", offset=3, length=100)
    assert got == {"data_b64": _b64(b"d\0"), "size_bytes": 5, "eof": True}


def test_an_upload_creates_parents_and_a_single_chunk_works(root: Path) -> None:
    got = run(root, "upload_chunk", path="n/e/w.txt", upload_id="a-1", data_b64=_b64(b"x"),
              first=True, last=True)  # fmt: skip
    assert got == {"path": "n/e/w.txt", "size_bytes": 1}


def test_upload_quota_is_checked_per_chunk_and_fails_the_upload(root: Path) -> None:
    args = {"path": "f", "upload_id": "q", "first": True, "last": False}
    run(root, "upload_chunk", 100, data_b64=_b64(b"x" * 60), **args)
    args["first"] = False
    fails(root, "upload_chunk", "WorkspaceFullError", 100, data_b64=_b64(b"x" * 60), **args)
    assert list(root.iterdir()) == []  # the partial upload is gone
    message = fails(root, "upload_chunk", "UploadError", 100, data_b64=_b64(b"x"), **args)
    assert "no upload 'q'" in message


def test_upload_abort_removes_the_partial_file(root: Path) -> None:
    run(root, "upload_chunk", path="d/f", upload_id="ab", data_b64=_b64(b"x"), first=True,
        last=False)  # fmt: skip
    assert run(root, "upload_abort", upload_id="ab") == {"upload_id": "ab", "removed": True}
    assert list((root / "d").iterdir()) == []
    assert run(root, "upload_abort", upload_id="ab", path="d/f")["removed"] is False


@pytest.mark.parametrize(
    ("args", "type_"),
    [
        ({"upload_id": "../x"}, "InvalidArgumentError"),
        ({"upload_id": ""}, "InvalidArgumentError"),
        ({"data_b64": "not base64!"}, "InvalidArgumentError"),
        ({"path": "../x"}, "InvalidPathError"),
        ({"path": "/tmp/x"}, "InvalidPathError"),
        ({"first": "yes"}, "InvalidArgumentError"),
    ],
)
def test_bad_uploads(root: Path, args: dict[str, Any], type_: str) -> None:
    full = {"path": "f", "upload_id": "u", "data_b64": "", "first": True, "last": True, **args}
    fails(root, "upload_chunk", type_, **full)


def test_an_upload_onto_a_directory_or_through_a_link_is_refused(
    root: Path, host_secret: Path
) -> None:
    (root / "d").mkdir()
    args = {"upload_id": "u", "data_b64": "", "first": True, "last": True}
    fails(root, "upload_chunk", "InvalidPathError", path="d", **args)
    (root / "out").symlink_to(host_secret.parent)
    fails(root, "upload_chunk", "InvalidPathError", path="out/x", **args)
    # A temporary file name planted as a symlink is not followed.
    (root / ".tooljail-upload-u").symlink_to(host_secret)
    fails(root, "upload_chunk", "InvalidPathError", path="f", **args)
    assert host_secret.read_text() == "host secret\n"


def test_bad_downloads(root: Path) -> None:
    (root / "d").mkdir()
    fails(root, "download_chunk", "FileNotFoundError", path="nope")
    fails(root, "download_chunk", "InvalidPathError", path="d")
    fails(root, "download_chunk", "InvalidPathError", path="../../etc/passwd")
    (root / "f").write_text("x")
    fails(root, "download_chunk", "InvalidArgumentError", path="f", offset=-1)
    fails(root, "download_chunk", "InvalidArgumentError", path="f", length=0)
