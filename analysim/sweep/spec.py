"""A sweep's SPEC: which ``analysim simulate`` runs make up the sweep.

The keys are simulate's long options with underscores for hyphens, taken from simulate's own
argument parser, so an option added to simulate is a sweep key at once. A scalar applies to every
cell; a list is an axis; the cells are the cross product of the axes, times the entries of an
optional ``cells:`` list (each a mapping of more keys), minus the cells matching an entry of an
optional ``exclude:`` list. Each cell's options go through simulate's parser, so a value that
``analysim simulate`` refuses is refused here, naming the key, before any cell runs.

One more kind of key: ``partition_set:`` as a mapping of partition fields
(``KIND/NAME/FLAVOR/RESOURCE/FIELD``, analysim.partitions.edits) to a value or a list of values;
each field is a key of its own (an axis when a list), and a cell passes its value to simulate as
``--partition-set FIELD=VALUE`` (null: the file's own value).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import itertools
import json
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysim.cli import simulate
from analysim.errors import UserError

# Keys the sweep sets itself: each cell writes to its own folder, without a progress bar.
SWEEP_OWNED = ("out", "no_progress")
# Options that change no result: left out of a cell's id.
NOT_IN_ID = ("no_plots",)
# Where the sweep's default differs from simulate's: per-cell PNGs cost more than most cells do, and
# ``analysim report`` draws the sweep's own figures (``no_plots: false`` brings them back).
SWEEP_DEFAULTS: dict[str, object] = {"no_plots": True}
SPECIAL = ("cells", "exclude")
MAX_CELLS = 10_000  # cells a SPEC may expand to: each is a simulate run (hours of CPU for the largest)
PARTITION_SET = "partition_set"
Scalar = str | int | float | bool | None


class SpecError(UserError):
    """A bad SPEC: the message names the file and the key."""


class _Refusal(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """simulate's parser, raising instead of exiting, so a bad value becomes our one-line error."""

    def error(self, message: str):  # type: ignore[override]
        raise _Refusal(message)


def simulate_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="analysim simulate", add_help=False)
    simulate.add_arguments(p)
    return p


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """SPEC key -> the simulate option it stands for."""
    out = {}
    for a in parser._actions:
        long = next((s for s in a.option_strings if s.startswith("--")), None)
        if long is None:
            continue
        key = long[2:].replace("-", "_")
        if key not in SWEEP_OWNED and key != "help":
            out[key] = a
    return out


@dataclass(frozen=True)
class Cell:
    """One simulate run of the sweep."""

    id: str
    args: argparse.Namespace  # as simulate's parser gives them (``out`` is set per cell)
    given: dict[str, Scalar]  # the SPEC's keys for this cell, as written
    axes: tuple[str, ...]  # the keys that vary across the sweep

    @property
    def label(self) -> str:
        return describe({k: self.given.get(k) for k in self.axes}) or "cell"

    def params(self) -> dict[str, object]:
        """Every simulate option's value for this cell (the results' parameter columns), and the
        partition fields it sets (``partition_set``), each under its own name."""
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()
               if k not in SWEEP_OWNED and k != "func"}
        out.update({k: v for k, v in self.given.items() if k not in out})
        return out


@dataclass(frozen=True)
class Sweep:
    cells: list[Cell]
    axes: tuple[str, ...]
    source: str


def show_value(v: object) -> str:
    """A parameter's value as a SPEC would spell it (null: simulate's default)."""
    return "true" if v is True else "false" if v is False else "default" if v is None else str(v)


def describe(values: dict) -> str:
    """``key=value ...``: a cell's or a group's label."""
    return " ".join(f"{k}={show_value(v)}" for k, v in values.items())


def read_spec(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'YAML'}: "
                        f"{' '.join(str(e).split())}") from None
    if not isinstance(data, dict) or not data:
        raise SpecError(f"{p}: expected a mapping of simulate options (e.g. 'policy: [fifo, srtf]')")
    return data


def load_sweep(path: str | Path) -> Sweep:
    return expand(read_spec(path), str(path))


@dataclass(frozen=True)
class PartitionField:
    """A ``partition_set`` key: stands for ``--partition-set PATH=VALUE`` in a cell's options."""

    path: str


def _partition_fields(data: dict, source: str, actions: dict) -> dict:
    """``partition_set: {PATH: values}`` as one key per PATH (``actions`` gets each); a
    ``partition_set`` of strings (PATH=VALUE) is simulate's own option and stays."""
    fields = data.get(PARTITION_SET)
    if not isinstance(fields, dict):
        return data
    from analysim.partitions.edits import parse_path

    if not fields:
        raise SpecError(f"{source}: {PARTITION_SET}: expected a mapping of partition fields to values, e.g. "
                        "'ClusterQueue/team-a/v100/nvidia.com/gpu/borrowingLimit: [0, 16]'")
    out = {k: v for k, v in data.items() if k != PARTITION_SET}
    for path, values in fields.items():
        try:
            key = str(parse_path(str(path)))
        except UserError as e:
            raise SpecError(f"{source}: {PARTITION_SET}: {e}") from None
        if key in out:
            raise SpecError(f"{source}: {PARTITION_SET}: {key} given twice")
        out[key] = values
        actions[key] = PartitionField(key)
    return out


def expand(data: dict, source: str = "SPEC") -> Sweep:
    """The cells of a SPEC, every one of them checked by simulate's parser."""
    parser = simulate_parser()
    actions: dict = option_actions(parser)
    data = _partition_fields(data, source, actions)

    def check_key(key: object, where: str) -> str:
        if not isinstance(key, str) or key not in actions:
            hint = difflib.get_close_matches(str(key), list(actions), n=1)
            owned = f" (the sweep sets --{str(key).replace('_', '-')} itself)" if key in SWEEP_OWNED else ""
            raise SpecError(f"{source}: {where}unknown key {key!r}: not an option of analysim simulate{owned}"
                            + (f"; did you mean {hint[0]!r}?" if hint else ""))
        return key

    fixed: dict[str, Scalar] = {k: v for k, v in SWEEP_DEFAULTS.items() if k not in data}
    axes: dict[str, list[Scalar]] = {}
    for key, value in data.items():
        if key in SPECIAL:
            continue
        check_key(key, "")
        if isinstance(value, list):
            if not value:
                raise SpecError(f"{source}: {key}: empty list: an axis needs at least one value")
            axes[key] = [_scalar(source, key, v) for v in value]
        else:
            fixed[key] = _scalar(source, key, value)
    for key, values in axes.items():
        if len(set(map(_canon, values))) != len(values):
            raise SpecError(f"{source}: {key}: a value appears twice in the axis")

    entries = data.get("cells")
    if entries is None:
        entries = [{}]
    elif not isinstance(entries, list) or not entries:
        raise SpecError(f"{source}: cells: expected a non-empty list of mappings of simulate options")
    explicit: list[dict[str, Scalar]] = []
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise SpecError(f"{source}: cells, entry {i}: expected a mapping of simulate options")
        for key in entry:
            check_key(key, f"cells, entry {i}: ")
            if key in data:
                raise SpecError(f"{source}: cells, entry {i}: {key} is set at the top level already")
        explicit.append({k: _scalar(source, f"cells, entry {i}: {k}", v) for k, v in entry.items()})

    excludes = data.get("exclude") or []
    if not isinstance(excludes, list) or not all(isinstance(e, dict) and e for e in excludes):
        raise SpecError(f"{source}: exclude: expected a list of non-empty mappings, e.g. "
                        "'- {policy: fifo, preemption: true}'")
    for i, rule in enumerate(excludes, 1):
        for key in rule:
            check_key(key, f"exclude, entry {i}: ")

    # Counted before any is made: a SPEC of a million cells is refused at once, not expanded.
    n = math.prod(len(v) for v in axes.values()) * len(explicit)
    if n > MAX_CELLS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in axes.items())
        raise SpecError(f"{source}: {n:,} cells ({sizes}{f' x {len(explicit)} cells entries' if len(explicit) > 1 else ''}"
                        f"); a sweep may have at most {MAX_CELLS:,}")
    combos = []
    for values in itertools.product(*axes.values()):
        for entry in explicit:
            given = {**fixed, **dict(zip(axes, values, strict=True))}
            given.update(entry)
            if not any(_matches(given, rule) for rule in excludes):
                combos.append(given)
    if not combos:
        raise SpecError(f"{source}: exclude: leaves no cell to run")

    varying = [k for k in _ordered_keys(combos) if len({_canon(c.get(k)) for c in combos}) > 1]
    _check_values(source, parser, actions, combos)
    cells, seen = [], set()
    for given in combos:
        args = _parse(source, parser, actions, given)
        cid = cell_id(args)
        if cid in seen:
            continue  # e.g. an explicit cell repeating an axis value: one run
        seen.add(cid)
        cells.append(Cell(cid, args, given, tuple(varying)))
    return Sweep(cells, tuple(varying), source)


def _ordered_keys(combos: list[dict]) -> list[str]:
    keys: dict[str, None] = {}
    for c in combos:
        keys.update(dict.fromkeys(c))
    return list(keys)


def _scalar(source: str, key: str, v: object) -> Scalar:
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    raise SpecError(f"{source}: {key}: expected a single value or a list of values, got {type(v).__name__} {v!r}")


def _canon(v: object) -> str:
    return json.dumps(v, sort_keys=True)


def _matches(given: dict, rule: dict) -> bool:
    for k, want in rule.items():
        options = want if isinstance(want, list) else [want]
        if _canon(given.get(k)) not in {_canon(o) for o in options}:
            return False
    return True


def _tokens(key: str, action: argparse.Action | PartitionField, value: Scalar) -> list[str]:
    if isinstance(action, PartitionField):
        if isinstance(value, bool):
            raise _Refusal(f"expected a quantity or none, got {show_value(value)}")
        return [] if value is None else [f"--partition-set={action.path}={value}"]  # null: the file's value
    long = next(s for s in action.option_strings if s.startswith("--"))
    if value is None:
        return []  # null: simulate's default
    if action.nargs == 0:  # a flag: store_true / store_false
        if not isinstance(value, bool):
            raise _Refusal(f"expected true or false, got {value!r}")
        return [long] if value != bool(action.default) else []
    if action.nargs not in (None, "?"):
        raise _Refusal(f"{long} takes several values, which a sweep does not support")
    if isinstance(value, bool):
        raise _Refusal(f"expected a value for {long}, got {show_value(value)}")
    return [f"{long}={value}"]  # one token: a value may start with "-"


def _check_values(source: str, parser, actions: dict, combos: list[dict]) -> None:
    """Each distinct (key, value) on its own, so that the error names the key."""
    seen = set()
    for given in combos:
        for key, value in given.items():
            if (key, _canon(value)) in seen:
                continue
            seen.add((key, _canon(value)))
            try:
                parser.parse_args(_tokens(key, actions[key], value))
            except _Refusal as e:
                raise SpecError(f"{source}: {key}: {show_value(value)}: {e}") from None


def _parse(source: str, parser, actions: dict, given: dict) -> argparse.Namespace:
    argv = [t for k, v in given.items() for t in _tokens(k, actions[k], v)]
    try:
        return parser.parse_args(argv)
    except _Refusal as e:
        raise SpecError(f"{source}: cell {describe(given)}: {e}") from None


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple[str, float, int], str] = {}


def _digest_cached(path: str) -> str:
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_mtime, st.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)
    return _DIGESTS[key]


def cell_id(args: argparse.Namespace) -> str:
    """Content address of a cell: its options, with each file an option names (the trace, a
    cluster spec) replaced by the digest of its bytes. Same id, same results."""
    params = {}
    for k, v in sorted(vars(args).items()):
        if k in SWEEP_OWNED or k in NOT_IN_ID or k == "func":
            continue
        if isinstance(v, str | Path) and str(v) and os.path.isfile(v):
            v = {"sha256": _digest_cached(str(v))}
        params[k] = str(v) if isinstance(v, Path) else v
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
