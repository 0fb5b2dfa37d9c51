"""The `[commands]` table and the allow-list check on a command line.

An allow-list names the programs a command may run (`run_command`,
`start_process`, a process's `command`). It is set at three levels, each only
narrowing the one above: the daemon's ``[commands] allow``, an identity's
``commands = [...]`` in the tokens file, and a tool's own profile
(``[tools.run_command] commands = [...]``). None at a level: no narrowing there;
no list at any level: no allow-list, every command runs.

`check_command` reads a command line as bash would split it, far enough to
name every program it would start: each command of a pipeline or list (``|``,
``|&``, ``&&``, ``||``, ``;``, ``&``, newlines, ``( )``, ``{ }``), past leading
assignments (``A=1 prog``), reserved words (``if``, ``then``, ``while``,
``!``...), the wrappers ``env``, ``command`` and ``exec``, and the scripts of
``bash -c`` / ``sh -c`` (unwrapped, recursively). What it cannot check it
refuses under an allow-list, saying why: command and process substitution
(``$(...)``, backticks, ``<(...)``), ``eval``, ``source``, ``trap``, here-docs,
``case``/``function``/``[[``/``((`` constructs, and a program whose name is
an expansion or a glob.

A rule that is a bare name (``git``) matches a program by its basename, so
``git``, ``/usr/bin/git`` and ``./git`` all match it; a rule with a slash
(``/usr/bin/git``) matches that exact path only. A few shell builtins that
start nothing (`ALWAYS_ALLOWED`: ``cd``, ``echo``, ``true``, ``export``...)
pass under any list. Any other wrapper (``sudo``, ``nohup``, ``timeout``,
``xargs``, ``nice``) is just a program: refused unless listed, and its
arguments are not read (listing it lets it run anything).

An allow-list on shell text is a convenience, not a wall: a listed program
may itself run others (``git -c core.pager=...``, ``pytest`` running
conftest.py, ``make``, ``python``). The sandbox is the wall (docs/commands.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, field_validator

from tooljail.errors import PermissionDeniedError, TooljailError

__all__ = [
    "ALWAYS_ALLOWED",
    "CommandsSettings",
    "check_command",
    "narrow",
    "programs_of",
]


class CommandsSettings(BaseModel):
    """Which programs commands may run on this daemon (`[commands]` in the config file)."""

    model_config = ConfigDict(extra="forbid")

    allow: list[str] | None = None
    """The programs a command (run_command, start_process, a process's command)
    may start, by name (``git``: any path named so) or exact path
    (``/usr/bin/git``). Absent or empty: no allow-list (every command runs).
    An identity's ``commands`` and a tool's own list (`tools`) only narrow it."""
    tools: dict[str, list[str]] = {}
    """A tool's own allow-list, by tool name (``[commands.tools] run_command =
    ["git"]``): calls of that tool may start only these (and what the levels
    above allow)."""

    @field_validator("allow")
    @classmethod
    def _check_rules(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            check_rules(v, "[commands] allow")
        return v or None

    @field_validator("tools")
    @classmethod
    def _check_tool_rules(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, rules in v.items():
            check_rules(rules, f"[commands.tools] {name}")
        return v

    def allowed(
        self, tool: str | None = None, identity: Iterable[str] | None = None
    ) -> frozenset[str] | None:
        """The allow-list in force for a call of `tool` by a caller whose own
        list is `identity` (None: it has none); None: no allow-list."""
        own = self.tools.get(tool) if tool is not None else None
        return narrow(self.allow, identity, own)


def check_rules(rules: Iterable[str], where: str) -> None:
    """Raise ValueError naming the first rule that names no program."""
    for rule in rules:
        if not isinstance(rule, str) or not rule or rule != rule.strip() or "\x00" in rule:
            raise ValueError(f"{where}: {rule!r} is not a program name or path")
        if "/" in rule and not rule.startswith("/"):
            raise ValueError(f"{where}: {rule!r}: a path must be absolute (or give a bare name)")


def narrow(*levels: Iterable[str] | None) -> frozenset[str] | None:
    """The allow-list in force: each level (None: none there) narrows the one above."""
    result: frozenset[str] | None = None
    for level in levels:
        if level is None:
            continue
        rules = frozenset(level)
        result = rules if result is None else result & rules
    return result


ALWAYS_ALLOWED = frozenset(
    {"cd", "pwd", "echo", "printf", "true", "false", "test", "[", ":", "export", "unset"}
    | {"set", "shift", "exit", "return", "wait", "read"}
)
"""Shell builtins that start no program: allowed under any allow-list."""

_REFUSED = {
    "eval": "eval runs text that cannot be checked",
    "source": "source runs a file that cannot be checked",
    ".": "`.` runs a file that cannot be checked",
    "trap": "trap runs text that cannot be checked",
    "alias": "an alias changes what later names run",
    "function": "a function definition cannot be checked",
    "case": "a case construct cannot be checked",
    "select": "a select construct cannot be checked",
    "coproc": "a coproc cannot be checked",
    "[[": "a [[ ]] test cannot be checked",
    "((": "an arithmetic command cannot be checked",
    "builtin": "builtin runs a builtin that cannot be checked",
    "enable": "enable changes what names run",
    "hash": "hash changes what names run",
}
_SKIPPED_WORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while"})
_SKIPPED_WORDS |= {"until", "!", "{", "}", "time"}
_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
_SEPARATORS = frozenset({"|", "|&", "||", "&", "&&", ";", ";;", "\n", "(", ")"})
_REDIRECTS = frozenset({"<", ">", ">>", "<>", ">|", "<&", ">&", "&>", "&>>", "<<<"})
_MAX_DEPTH = 8


class _Expanded(str):
    """A word with an expansion or a glob in it (``$X``, ``*.py``): what it
    names is known only when the shell runs it."""

    __slots__ = ()


class Uncheckable(TooljailError, ValueError):
    """The command line holds something whose programs cannot be named.

    Control flow of `programs_of`: `check_command` turns it into a
    `PermissionDeniedError`; in the daemon's error tree like every exception
    the daemon defines."""


def check_command(
    command: str | None, argv: Sequence[str] | None, allowed: frozenset[str] | None
) -> None:
    """Refuse a command that would start a program not in `allowed`.

    Args:
        command: A shell command line (as ``bash -c`` runs it); or None.
        argv: A plain argv (no shell); or None. Exactly one of the two is used
            (`command` when both are given).
        allowed: The allow-list in force (`narrow`); None: none, every command
            passes. Empty (levels that share no program): no program passes.

    Raises:
        PermissionDeniedError: It names a program not in the list, or holds
            what cannot be checked (a substitution, eval...): the message
            names the program (or the construct) and the list.
    """
    if allowed is None:
        return
    try:
        programs = programs_of(command, argv)
    except Uncheckable as exc:
        raise PermissionDeniedError(
            f"the command cannot be checked against the allow-list ({_listed(allowed)}): "
            f"{exc}; write it as plain commands, pipelines and lists of listed programs"
        ) from None
    for program in programs:
        if not _matches(program, allowed):
            raise PermissionDeniedError(
                f"the program {program!r} is not in the allow-list of commands "
                f"({_listed(allowed)}): run only those"
            )


def programs_of(command: str | None, argv: Sequence[str] | None) -> list[str]:
    """Every program a command line or an argv would start, in order.

    Raises:
        Uncheckable: What cannot be checked; the message says what and why.
    """
    if command is not None:
        return _programs_of_text(command, 0)
    return _programs_of_words(list(argv or ()), 0)


def _listed(allowed: frozenset[str]) -> str:
    return ", ".join(sorted(allowed))


def _matches(program: str, allowed: frozenset[str]) -> bool:
    if program in ALWAYS_ALLOWED or program in allowed:
        return True
    if "/" in program:
        # A bare-name rule matches any path of that basename; a path rule only itself.
        return os.path.basename(program) in allowed
    return False


def _programs_of_text(text: str, depth: int) -> list[str]:
    if depth > _MAX_DEPTH:
        raise Uncheckable("shells nested too deep")
    programs: list[str] = []
    for words in _simple_commands(text):
        programs += _programs_of_words(words, depth)
    return programs


def _programs_of_words(words: list[str], depth: int) -> list[str]:
    """The programs one simple command (its words, redirections removed) starts."""
    i = 0
    while i < len(words) and _is_assignment(words[i]):
        i += 1
    while i < len(words) and words[i] in _SKIPPED_WORDS:
        i += 1
        while i < len(words) and _is_assignment(words[i]):
            i += 1
    if i >= len(words):
        return []
    program = words[i]
    rest = words[i + 1 :]
    if isinstance(program, _Expanded):
        raise Uncheckable(f"the program name {program!r} is an expansion or a glob")
    if program in _REFUSED:
        raise Uncheckable(_REFUSED[program])
    if program == "for":
        return []  # the header of a for loop (`for x in a b`): its body is its own command
    if program == "env":
        return _after_options(rest, depth, {"-u", "--unset", "-C", "--chdir"})
    if program == "command":
        if any(arg in ("-v", "-V") for arg in rest[:2]):
            return []  # a lookup: runs nothing
        return _after_options(rest, depth, set())
    if program == "exec":
        return _after_options(rest, depth, {"-a"})
    if os.path.basename(program) in _SHELLS:
        script = _shell_script(rest)
        if script is not None:
            # The shell with -c is transparent: what its script runs is what runs.
            return _programs_of_text(script, depth + 1)
    return [program]


def _after_options(rest: list[str], depth: int, with_value: set[str]) -> list[str]:
    """The program a wrapper (env, command, exec) runs: past its options and
    assignments; none when it runs none (`env` alone prints the environment)."""
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            i += 1
            break
        if word in with_value:
            i += 2
        elif word.startswith("-") or _is_assignment(word):
            if word.startswith("-S") or word == "--split-string" or word.startswith("--split"):
                raise Uncheckable("env -S splits text that cannot be checked")
            i += 1
        else:
            break
    return _programs_of_words(rest[i:], depth) if i < len(rest) else []


def _shell_script(args: list[str]) -> str | None:
    """The script of ``bash -c SCRIPT`` (options may come before: ``-lc``, ``-e -c``)."""
    for i, arg in enumerate(args):
        if arg == "--" or (not arg.startswith("-") and not arg.startswith("+")):
            return None
        if not arg.startswith("--") and "c" in arg[1:]:
            if i + 1 >= len(args):
                raise Uncheckable("`-c` without a script")
            if isinstance(args[i + 1], _Expanded):
                raise Uncheckable("a shell's -c script is an expansion")
            return args[i + 1]
    return None


def _is_assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.replace("_", "a").isalnum() and not name[0].isdigit()


def _simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a command line: each one's words, with quotes
    removed and redirections (and their targets) dropped.

    Raises:
        Uncheckable: a substitution, a here-doc, an expansion or glob as a
            program name, or an unterminated quote.
    """
    commands: list[list[str]] = []
    words: list[str] = []
    # Each word: its text and whether any of it came from an unquoted or
    # double-quoted expansion or glob (a program named so cannot be checked).
    word: list[str] | None = None
    dynamic = False
    redirect_next = False
    i, n = 0, len(text)

    def end_word() -> None:
        nonlocal word, dynamic, redirect_next
        if word is None:
            return
        if redirect_next:
            redirect_next = False  # a redirection's target: a file, not a word
        else:
            joined = "".join(word)
            words.append(_Expanded(joined) if dynamic else joined)
        word, dynamic = None, False

    def end_command() -> None:
        nonlocal words
        end_word()
        if redirect_next:
            raise Uncheckable("a redirection without a target")
        if words:
            commands.append(words)
        words = []

    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                word = (word or []) + [text[i + 1]]
            i += 2
            continue
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise Uncheckable("an unterminated single quote")
            word = (word or []) + [text[i + 1 : end]]
            i = end + 1
            continue
        if c == '"':
            i += 1
            part: list[str] = []
            while i < n and text[i] != '"':
                ch = text[i]
                if ch == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    part.append(text[i + 1])
                    i += 2
                    continue
                if ch == "`" or text.startswith("$(", i):
                    raise Uncheckable("command substitution ($(...) or backticks)")
                if ch == "$":
                    dynamic = True
                part.append(ch)
                i += 1
            if i >= n:
                raise Uncheckable("an unterminated double quote")
            word = (word or []) + part
            i += 1
            continue
        if c == "`" or text.startswith("$(", i):
            raise Uncheckable("command substitution ($(...) or backticks)")
        if text.startswith(("<(", ">("), i):
            raise Uncheckable("process substitution (<(...) or >(...))")
        if c == "#" and word is None:
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c in " \t":
            end_word()
            i += 1
            continue
        op = _operator_at(text, i)
        if op is not None:
            if op in ("<<", "<<-"):
                raise Uncheckable("a here-document")
            if op in _REDIRECTS:
                # `2>file`, `2>&1`: a number right before belongs to the redirection.
                if word is not None and "".join(word).isdigit() and not dynamic:
                    word = None
                end_word()
                redirect_next = True
                i += len(op)
                if op in (">&", "<&") and i < n and (text[i].isdigit() or text[i] == "-"):
                    while i < n and (text[i].isdigit() or text[i] == "-"):
                        i += 1
                    redirect_next = False
                continue
            end_word()
            if op == "(" and words:
                # `name ( ) { ...; }`: bash reads a function definition.
                raise Uncheckable("a function definition cannot be checked")
            end_command()
            i += len(op)
            continue
        if c in "$*?[":
            dynamic = True
        word = (word or []) + [c]
        i += 1
    end_command()
    return commands


_OPERATORS = sorted((*_SEPARATORS, *_REDIRECTS, "<<", "<<-"), key=len, reverse=True)


def _operator_at(text: str, i: int) -> str | None:
    for op in _OPERATORS:
        if text.startswith(op, i):
            return op
    return None
