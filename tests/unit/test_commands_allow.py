"""The allow-list of commands (tooljaild.settings.commands): what a command
line starts, as bash would split it, and what cannot be checked."""

from __future__ import annotations

import pytest

from tooljail.errors import PermissionDeniedError
from tooljaild.settings.commands import CommandsSettings, check_command, narrow, programs_of


@pytest.mark.parametrize(
    ("command", "programs"),
    [
        ("git status", ["git"]),
        ("cd repo && pytest -x -q | tee log; echo done", ["cd", "pytest", "tee", "echo"]),
        ("a || b & c\nd", ["a", "b", "c", "d"]),
        ("git log 2>&1 >/dev/null | head -n1", ["git", "head"]),
        ("A=1 B='x y' make all", ["make"]),
        ("env -i A=1 -u B git log", ["git"]),
        ("command git log; command -v rm", ["git"]),
        ("exec -a name git", ["git"]),
        ("bash -lc 'git log | sort'", ["git", "sort"]),
        ("sh -c \"bash -c 'make x'\"", ["make"]),
        ("bash script.sh", ["bash"]),
        ("for f in *.py; do pytest $f; done", ["pytest"]),
        ("if true; then ls; else rm x; fi", ["true", "ls", "rm"]),
        ("(cd x && make) | grep y", ["cd", "make", "grep"]),
        ("{ git a; git b; }", ["git", "git"]),
        ("echo 'a | rm' \"b ; rm\"", ["echo"]),
        ("/usr/bin/git x; ./tool", ["/usr/bin/git", "./tool"]),
        ("sudo rm -rf /", ["sudo"]),
        ("git x # | rm", ["git"]),
        ("cat <<< 'text' | wc -l", ["cat", "wc"]),
    ],
)
def test_programs_of_a_command_line(command: str, programs: list[str]) -> None:
    assert programs_of(command, None) == programs


def test_programs_of_an_argv() -> None:
    assert programs_of(None, ["bash", "-c", "git log && rm x"]) == ["git", "rm"]
    assert programs_of(None, ["env", "A=1", "python", "-c", "1"]) == ["python"]


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("echo $(rm -rf /)", "command substitution"),
        ('echo "`rm x`"', "command substitution"),
        ("diff <(ls a) <(ls b)", "process substitution"),
        ("eval 'rm -rf /'", "eval"),
        ("source ./x.sh", "source"),
        (". ./x.sh", "`.`"),
        ("trap 'rm x' EXIT", "trap"),
        ("cat <<EOF\nrm\nEOF", "here-document"),
        ("$PROG x", "expansion"),
        ("*.sh", "glob"),
        ('bash -c "$SCRIPT"', "expansion"),
        ("case x in y) rm;; esac", "case"),
        ("f() { rm x; }; f", "cannot be checked"),
        ("echo 'unterminated", "unterminated"),
        ("env -S 'rm x'", "env -S"),
    ],
)
def test_what_cannot_be_checked_is_refused_under_a_list(command: str, why: str) -> None:
    with pytest.raises(PermissionDeniedError, match="cannot be checked") as caught:
        check_command(command, None, frozenset({"git", "echo", "cat", "bash", "diff"}))
    assert why in str(caught.value)
    check_command(command, None, None)  # no allow-list: nothing is parsed, all runs


def test_refusal_names_the_program_and_the_list() -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        check_command("git log | curl -d @- x", None, frozenset({"git", "grep"}))
    assert "'curl'" in str(caught.value) and "git, grep" in str(caught.value)


def test_a_bare_name_rule_matches_any_path_a_path_rule_only_itself() -> None:
    check_command("/usr/bin/git log; ./git x", None, frozenset({"git"}))
    check_command("/usr/bin/git log", None, frozenset({"/usr/bin/git"}))
    with pytest.raises(PermissionDeniedError):
        check_command("/opt/git log", None, frozenset({"/usr/bin/git"}))
    with pytest.raises(PermissionDeniedError):
        check_command("git log", None, frozenset({"/usr/bin/git"}))


def test_builtins_that_start_nothing_pass_any_list() -> None:
    check_command("cd repo && echo hi; true; export A=1", None, frozenset({"git"}))


def test_levels_only_narrow() -> None:
    assert narrow(None, None, None) is None
    assert narrow(["git", "make"], None, ["git", "rm"]) == frozenset({"git"})
    assert narrow(None, ["rm"], None) == frozenset({"rm"})
    settings = CommandsSettings(allow=["git", "make"], tools={"run_command": ["git"]})
    assert settings.allowed("run_command", ["make", "git"]) == frozenset({"git"})
    assert settings.allowed("start_process", None) == frozenset({"git", "make"})
    assert CommandsSettings(allow=[]).allowed("run_command") is None


@pytest.mark.parametrize("rule", ["", " git", "bin/git", "a\x00b"])
def test_bad_rules_are_refused_by_name(rule: str) -> None:
    with pytest.raises(ValueError, match="commands"):
        CommandsSettings(allow=[rule])


def test_levels_that_share_no_program_allow_none() -> None:
    # The daemon allows git, the identity ls: together nothing, never everything.
    allowed = narrow(["git"], ["ls"])
    assert allowed == frozenset()
    with pytest.raises(PermissionDeniedError):
        check_command("ls -l", None, allowed)
    with pytest.raises(PermissionDeniedError):
        check_command(None, ["git", "status"], allowed)
