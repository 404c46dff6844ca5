"""argparse value types shared by the commands and the services' own entry points: a bad value is a
one-line usage error."""

from __future__ import annotations

import argparse

from analysim.core.job import MAX_TIME_S


def _parsed(text: str, convert: type[int] | type[float], expected: str) -> int | float:
    """``convert(text)``, or the one-line usage error every type here gives for a non-number."""
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def nonneg_int(text: str) -> int:
    v = _parsed(text, int, "a non-negative integer")
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {v}")
    return v


def count_at_most(most: int, what: str):  # noqa: ANN201 — an argparse type
    """A non-negative integer up to ``most`` (past it, ``what`` says why there is a limit)."""

    def parse(text: str) -> int:
        v = nonneg_int(text)
        if v > most:
            raise argparse.ArgumentTypeError(f"expected at most {most:,} ({what}), got {v:,}")
        return v

    return parse


def positive_int(text: str) -> int:
    v = _parsed(text, int, "a positive integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def port(text: str) -> int:
    v = _parsed(text, int, "a port number")
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {v}")
    return v


def wall_seconds(lo: float, hi: float):  # noqa: ANN201 — an argparse type
    """Wall seconds in [lo, hi]."""

    def parse(text: str) -> float:
        v = _parsed(text, float, "wall seconds")
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo:g} and {hi:g} wall seconds, got {v:g}")
        return v

    return parse


def rate(text: str) -> float:
    v = _parsed(text, float, "requests per second")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return v


def seconds(text: str) -> float:
    """A duration in seconds, from 0 to MAX_TIME_S: NaN, infinities and negative times break the
    clock's arithmetic (time going backwards, overflow, jobs finishing before their duration)."""
    v = _parsed(text, float, "seconds")
    if not 0 <= v <= MAX_TIME_S:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to {MAX_TIME_S:g}, got {text}")
    return v


def positive_seconds(text: str) -> float:
    v = seconds(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text}")
    return v


def positive_number(text: str, maximum: float = 1e6) -> float:
    v = _parsed(text, float, "a number")
    if not 0 < v <= maximum:
        raise argparse.ArgumentTypeError(f"expected a number above 0 and at most {maximum:g}, got {text}")
    return v


def fraction(text: str) -> float:
    """A share from 0 to 1 (a threshold on a status in [0, 1])."""
    v = _parsed(text, float, "a number from 0 to 1")
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text}")
    return v


def percent(text: str) -> float:
    """A share of capacity in percent, above 0 and at most 1000."""
    try:
        v = float(text.removesuffix("%"))
    except ValueError:  # the message shows the text as given, with its %
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 < v <= 1000:
        raise argparse.ArgumentTypeError(f"expected a percentage above 0 and at most 1000, got {text}")
    return v


def control_plane(text: str) -> str:
    """``--control-plane``, checked: ``kueue`` (Kueue's defaults, analysim.core.control_plane), or
    ``kueue,`` followed by FIELD=VALUE pairs overriding them, e.g. ``kueue,heads_per_queue=4``.
    The value stays text (options are recorded and swept as JSON); control_plane_config reads it."""
    return control_plane_config(text).as_flag()


def control_plane_config(text: str):  # noqa: ANN201 — analysim.core.control_plane.ControlPlaneConfig
    """The configuration a ``--control-plane`` value gives (argparse.ArgumentTypeError if none)."""
    from dataclasses import fields

    from analysim.core.control_plane import ControlPlaneConfig

    name, *pairs = [p.strip() for p in text.split(",")]
    if name != "kueue":
        raise argparse.ArgumentTypeError(f"expected 'kueue' or 'kueue,FIELD=VALUE,...', got {text!r}")
    known = {f.name: f.type for f in fields(ControlPlaneConfig)}
    values: dict[str, int | float] = {}
    for pair in pairs:
        field, sep, value = pair.partition("=")
        if not sep or field not in known:
            raise argparse.ArgumentTypeError(f"{pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(known)}")
        # (a field's type is a string in a plain dataclass, the class itself once mypyc compiled it)
        values[field] = _parsed(value, int if known[field] in (int, "int") else float, f"a number for {field}")
    try:
        return ControlPlaneConfig(**values)  # type: ignore[arg-type]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
