"""Errors a user can cause. The CLI prints them as one line, without a traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path


class UserError(Exception):
    """Bad input from the user: a file, a flag, a value. ``str()`` is the whole message."""


class InputFileError(UserError):
    """A problem at a place in an input file: names the file, the line and the column."""

    def __init__(self, path: str, line: int | None, column: str | None, problem: str) -> None:
        self.path, self.line, self.column, self.problem = path, line, column, problem
        where = path
        if line is not None:
            where += f", line {line}"
        if column:
            where += f", column {column!r}"
        super().__init__(f"{where}: {problem}")


def read_text(path: str | Path, *, most: int | None = None, what: str = "file", encoding: str = "utf-8") -> str:
    """A user's text file whole, or a one-line UserError naming it: missing, unreadable, not
    UTF-8, or longer than ``most`` characters (``what`` names the kind of file the limit is for)."""
    try:
        text = Path(path).read_text(encoding=encoding)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if most is not None and len(text) > most:
        raise UserError(f"{path}: {len(text):,} characters; {what} may have at most {most:,}")
    return text


def run_command(prog: str, fn: Callable[[], int | None], say_interrupted: bool = False) -> int:
    """A command line's exit code for ``fn``: a UserError is one line on stderr and 2 (no
    traceback), Ctrl-C is 130 (with a line saying so if asked), and a closed stdout (``| head``)
    ends the command quietly with 141, as SIGPIPE ends a Unix filter."""
    try:
        return int(fn() or 0)
    except BrokenPipeError:
        # Python ignores SIGPIPE (restoring it would let a closed socket kill a server); instead,
        # point stdout at /dev/null so that the flush at exit cannot fail again, and say nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if say_interrupted:
            print(f"{prog}: interrupted", file=sys.stderr)
        return 130
