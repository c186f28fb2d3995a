"""A deliberately small reading of `sh -c` command strings, so `file_check` commands run without a shell.

Supported: words and quoting as `shlex` (POSIX) reads them, `a && b` chains, and command substitution
`$(cmd)` (outside single quotes), whose output becomes exactly ONE argument (trailing newlines
removed, no word splitting, unlike an unquoted shell substitution). Everything else a shell would
interpret is refused with CheckerSpecError: pipes, `;`, `||`, redirections, background `&`, subshells,
braces, backticks and `$VAR` expansion. Glob characters are passed literally (as a shell does when
nothing matches). These are the forms the MetaClaw-Bench eval commands use.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from rewards.checkers.base import CheckerSpecError

PH_OPEN, PH_CLOSE = "\ue000", "\ue001"  # private-use characters mark a substitution inside a word
UNSUPPORTED = {"|": "pipe", ";": "';'", "&": "background '&'", "<": "redirection", ">": "redirection",
               "(": "subshell", ")": "subshell", "{": "brace group", "}": "brace group",
               "\n": "newline", "`": "backtick substitution"}


@dataclass(frozen=True)
class Simple:
    """One simple command: argv words, where `PH_OPEN i PH_CLOSE` stands for the output of `subs[i]`."""

    words: tuple[str, ...]
    subs: tuple[Simple, ...] = ()


def placeholder(i: int) -> str:
    return f"{PH_OPEN}{i}{PH_CLOSE}"


def _match_paren(cmd: str, start: int) -> int:
    """Index of the `)` closing the `$(` whose body starts at `start` (quotes respected)."""
    depth, quote, i = 1, None, start
    while i < len(cmd):
        c = cmd[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "\\":
            i += 1
        elif quote == '"':
            quote = None if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise CheckerSpecError(f"unterminated $( in command {cmd[:80]!r}")


def _scan(cmd: str) -> list[tuple[str, list[str]]]:
    """Split `cmd` at top-level `&&` into (text with placeholders, substitution bodies)."""
    segments: list[tuple[str, list[str]]] = []
    buf: list[str] = []
    subs: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(cmd):
        c = cmd[i]
        if quote == "'":
            quote = None if c == "'" else quote
            buf.append(c)
        elif c == "\\":
            buf.append(cmd[i:i + 2])
            i += 1
        elif c == "$" and cmd[i + 1:i + 2] == "(":
            end = _match_paren(cmd, i + 2)
            subs.append(cmd[i + 2:end])
            buf.append(placeholder(len(subs) - 1))
            i = end
        elif c == "$" and (cmd[i + 1:i + 2].isalnum() or cmd[i + 1:i + 2] in ("_", "{", "@", "*", "#", "?", "!", "$")):
            raise CheckerSpecError(f"variable expansion is not supported: {cmd[i:i + 12]!r}")
        elif c == "`":
            raise CheckerSpecError("backtick substitution is not supported; use $(...)")
        elif quote == '"':
            quote = None if c == '"' else quote
            buf.append(c)
        elif c in "'\"":
            quote = c
            buf.append(c)
        elif cmd.startswith("&&", i):
            segments.append(("".join(buf), subs))
            buf, subs = [], []
            i += 1
        elif c in UNSUPPORTED:
            raise CheckerSpecError(f"{UNSUPPORTED[c]} is not supported in eval commands (no shell)")
        else:
            buf.append(c)
        i += 1
    if quote:
        raise CheckerSpecError(f"unterminated {quote} quote in command {cmd[:80]!r}")
    segments.append(("".join(buf), subs))
    return segments


def parse_command(cmd: str) -> list[Simple]:
    """The `&&`-chained simple commands of `cmd`, in order. CheckerSpecError on unsupported syntax.

    `parse_command("python a.py x && python b.py $(python -c 'print(1)')")` ->
    [Simple(("python", "a.py", "x")), Simple(("python", "b.py", "\\ue0000\\ue001"), subs=(...,))]
    """
    if not isinstance(cmd, str) or not cmd.strip():
        raise CheckerSpecError("'command' must be a non-empty string")
    out = []
    for text, sub_texts in _scan(cmd):
        try:
            words = tuple(shlex.split(text, posix=True))
        except ValueError as e:
            raise CheckerSpecError(f"cannot parse command segment {text[:80]!r}: {e}") from e
        if not words:
            raise CheckerSpecError(f"empty command in {cmd[:80]!r}")
        subs = []
        for body in sub_texts:
            inner = parse_command(body)
            if len(inner) != 1:
                raise CheckerSpecError(f"$(...) must hold one simple command, got {body[:80]!r}")
            subs.append(inner[0])
        out.append(Simple(words, tuple(subs)))
    return out
