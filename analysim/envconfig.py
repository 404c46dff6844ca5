"""Configuration the container way: every long option of a command line is also an
environment variable, ``--metrics-port`` -> ``ANALYSIM_METRICS_PORT``; flags given on the
command line win. ``ANALYSIM_<OPTION>_FILE`` names a file holding the value (secrets mounted
as files: Docker and Kubernetes secrets), unless the command has an option ``--<option>-file``
of its own, which that variable then sets.

One call per parser, before ``parse_args``: ``apply_env(parser)``. Subcommands are walked, so
an option every subcommand shares (``--db``) is one variable. An unusable value is a one-line
error naming the variable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

PREFIX = "ANALYSIM_"
FILE_SUFFIX = "_FILE"
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}
# Actions that are not settings: --help, --version, subcommand selectors.
_SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)  # noqa: SLF001


def env_name(option: str) -> str:
    """``--metrics-port`` -> ``ANALYSIM_METRICS_PORT``."""
    return PREFIX + option.lstrip("-").replace("-", "_").upper()


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for a in parser._actions:  # noqa: SLF001 — argparse has no public listing
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            for sub in dict.fromkeys(a.choices.values()):  # aliases map to the same parser
                yield from _parsers(sub)


def _long_option(a: argparse.Action) -> str | None:
    longs = [o for o in a.option_strings if o.startswith("--")]
    return longs[0] if longs else None


def _raw_value(var: str, env: Mapping[str, str], own_options: set[str]) -> str | None:
    if var in env:
        return env[var]
    file_var = var + FILE_SUFFIX
    if file_var in env and file_var not in own_options:
        path = env[file_var]
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise _EnvError(f"{file_var}: cannot read {path}: {e}") from e
    return None


class _EnvError(Exception):
    pass


def _convert(parser: argparse.ArgumentParser, a: argparse.Action, var: str, raw: str) -> object:
    if isinstance(a, argparse._StoreTrueAction | argparse._StoreFalseAction):  # noqa: SLF001
        word = raw.strip().lower()
        if word not in TRUE | FALSE:
            raise _EnvError(f"{var}: expected true or false, got {raw!r}")
        on = word in TRUE
        return on if isinstance(a, argparse._StoreTrueAction) else not on  # noqa: SLF001
    if isinstance(a, argparse._StoreConstAction | argparse._CountAction):  # noqa: SLF001
        raise _EnvError(f"{var}: {_long_option(a)} cannot be set from the environment")
    items = [s.strip() for s in raw.split(",") if s.strip()] if isinstance(a, argparse._AppendAction) else [raw]  # noqa: SLF001
    out = []
    for item in items:
        try:
            v = parser._get_value(a, item)  # noqa: SLF001 — the same conversion as on the command line
        except argparse.ArgumentError as e:
            raise _EnvError(f"{var}: {e.message}") from None
        if a.choices is not None and v not in a.choices:
            raise _EnvError(f"{var}: {v!r} is not one of {', '.join(map(str, a.choices))}")
        out.append(v)
    return out if isinstance(a, argparse._AppendAction) else out[0]  # noqa: SLF001


def apply_env(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Make ``ANALYSIM_*`` variables the defaults of ``parser``'s long options (and its
    subcommands'); an option a variable sets is no longer required on the command line.
    ``--help`` says so."""
    env = os.environ if env is None else env
    note = (f"Every --option can also be set as {PREFIX}OPTION in the environment (flags win); "
            f"{PREFIX}OPTION{FILE_SUFFIX} reads the value from a file.")
    for p in _parsers(parser):
        p.epilog = f"{p.epilog}\n{note}" if p.epilog else note
        actions = [a for a in p._actions if not isinstance(a, _SKIP) and _long_option(a)]  # noqa: SLF001
        own = {env_name(_long_option(a)) for a in actions}  # type: ignore[arg-type]
        for a in actions:
            var = env_name(_long_option(a))  # type: ignore[arg-type]
            try:
                raw = _raw_value(var, env, own)
                if raw is None:
                    continue
                a.default = _convert(p, a, var, raw)
            except _EnvError as e:
                p.error(f"environment: {e}")
            a.required = False

