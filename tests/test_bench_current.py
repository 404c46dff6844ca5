"""bench/current.py, BENCHMARKS.md's current tables: an area's table replaces only what lies between its
markers, every row names its command, machine and load, and one real quick run of the simulation area
through the script into a copy of BENCHMARKS.md. No benchmark runs at its real size here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared import TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # the bench scripts import each other by module name

from current import RowFailed, Spec, measure  # noqa: E402
from current_table import MarkerError, Row, markers, render, replace_table  # noqa: E402

ROW = Row("fifo, whole extract", "82,247 jobs", "analysim simulate --trace T --out OUT", 31.04, 30.5, (2.5, 3.76),
          "AMD EPYC, 2 cores, Python 3.11.7, compiled core", "2026-12-05 14:00, abc1234")
LOAD = re.compile(r"^\d+\.\d → \d+\.\d$")


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def between(text: str, area: str) -> str:
    begin, end = markers(area)
    return text[text.index(begin) + len(begin):text.index(end)]


def outside(text: str, area: str) -> tuple[str, str]:
    begin, end = markers(area)
    return text[:text.index(begin) + len(begin)], text[text.index(end):]


def test_a_table_replaces_only_what_lies_between_its_markers() -> None:
    begin, end = markers("simulation")
    kb, ke = markers("kueue")
    # Odd bytes outside: trailing spaces, tabs, no final newline, a table of another area.
    text = (f"# Benchmarks  \n\ttext é\n{begin}\nold row\n| stale | table |\n{end}\nbetween\r\n"
            f"{kb}\n| kueue's own |\n{ke}\ntail without newline")
    new = replace_table(text, "simulation", render([ROW]))
    assert outside(new, "simulation") == outside(text, "simulation")
    assert between(new, "simulation") == "\n" + render([ROW])
    assert between(new, "kueue") == between(text, "kueue")
    again = replace_table(new, "simulation", render([ROW, ROW]))
    assert outside(again, "simulation") == outside(text, "simulation")
    assert between(again, "simulation").count("fifo, whole extract") == 2


@pytest.mark.parametrize("text", ["no markers at all\n",
                                  "<!-- current:simulation:begin -->\nonly the begin marker\n",
                                  "<!-- current:simulation:end -->\n<!-- current:simulation:begin -->\n",
                                  "<!-- current:simulation:begin -->\n<!-- current:simulation:end -->\n" * 2])
def test_missing_twice_or_swapped_markers_are_refused(text: str) -> None:
    with pytest.raises(MarkerError):
        replace_table(text, "simulation", render([ROW]))


def test_a_row_names_its_command_machine_and_load() -> None:
    header, rule, line = render([ROW]).splitlines()
    named = dict(zip(cells(header), cells(line), strict=True))
    assert len(rule.strip("|").split("|")) == len(named)
    assert named["command"] == "`analysim simulate --trace T --out OUT`"
    assert named["machine"] == "AMD EPYC, 2 cores, Python 3.11.7, compiled core"
    assert named["load, 1 min: start → end"] == "2.5 → 3.8"
    assert (named["wall s"], named["CPU s"]) == ("31.0", "30.5")
    assert named["when (UTC), commit"] == "2026-12-05 14:00, abc1234"


def test_a_row_without_its_input_is_skipped_naming_the_file() -> None:
    spec = Spec("needs a file", [sys.executable, "-c", "raise SystemExit(1)"], ("../shared/no-such-file.csv",),
                lambda out, m: "never read")
    row = measure(spec, "abc1234", 60)
    assert row.figure == "skipped: ../shared/no-such-file.csv absent"
    assert row.wall_s is None and row.load is None
    assert cells(row.line())[5].endswith(" -c 'raise SystemExit(1)'`")


def test_a_failing_command_fails_its_row_with_its_output() -> None:
    spec = Spec("fails", [sys.executable, "-c", "print('what went wrong'); raise SystemExit(3)"], (),
                lambda out, m: "never read")
    with pytest.raises(RowFailed, match=r"exit 3; its last lines:\nwhat went wrong"):
        measure(spec, "abc1234", 60)


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/current.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_a_file_without_the_markers_is_refused_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "B.md"
    f.write_text("# Benchmarks\n<!-- current:simulation:begin -->\n<!-- current:simulation:end -->\n")
    r = script("--area", "kueue", "--file", str(f), "--dry-run")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"current.py: {f}: needs exactly one <!-- current:kueue:begin --> and one "
                                "<!-- current:kueue:end --> line")
    r = script("--file", str(tmp_path / "absent.md"))
    assert (r.returncode, r.stderr.strip()) == (2, f"current.py: {tmp_path / 'absent.md'} not found")


@needs_shared(TRACES / "philly.csv")
def test_a_quick_simulation_run_writes_its_table_and_nothing_else(tmp_path: Path) -> None:
    original = (ROOT / "BENCHMARKS.md").read_text()
    copy = tmp_path / "BENCHMARKS.md"
    copy.write_text(original)
    r = script("--quick", "--area", "simulation", "--file", str(copy))
    assert r.returncode == 0, r.stderr
    written = copy.read_text()
    assert outside(written, "simulation") == outside(original, "simulation")
    lines = between(written, "simulation").strip().splitlines()
    assert cells(lines[0])[:4] == ["measured", "figure", "wall s", "CPU s"]
    rows = [dict(zip(cells(lines[0]), cells(line), strict=True)) for line in lines[2:]]
    assert len(rows) == 2
    for row in rows:
        assert re.fullmatch(r"`\S*python\S* -m analysim simulate --trace \.\./shared/traces/philly\.csv .*--limit 2000 .*`",
                            row["command"]), row
        assert re.fullmatch(r".+, \d+ cores, Python 3\.\d+\.\d+, (compiled|pure-Python) core", row["machine"]), row
        assert LOAD.match(row["load, 1 min: start → end"]), row
        assert float(row["wall s"]) > 0 and float(row["CPU s"]) > 0
        assert row["figure"].startswith("2,000 jobs, "), row
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d, [0-9a-f]{7,}( \+ uncommitted changes)?", row["when (UTC), commit"])
