"""``analysim trace info|convert|generate`` through the real entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

import analysim.cli
from analysim.traces import load_trace

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def run(monkeypatch, capsys):
    """Run ``analysim ARGS`` with only the trace subcommand registered (the others are not ours to
    import here); returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(analysim.cli, "SUBCOMMANDS", ("trace",))

    def go(*args: str) -> tuple[int, str, str]:
        try:
            code = analysim.cli.main(["trace", *args])
        except SystemExit as e:  # argparse usage errors
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return go


def test_info_philly(run):
    code, out, err = run("info", str(DATA / "philly_small.csv"))
    assert code == 0 and err == ""
    assert "(format philly)" in out and "jobs              5" in out
    assert "6214e9" in out and "(3 VCs)" in out
    assert "p50" in out and "GPU-hours" in out


def test_info_openb_shows_fractions_and_filters(run):
    code, out, _ = run("info", str(DATA / "openb_small.csv"), "--format", "openb")
    assert code == 0
    assert "never_scheduled 1, deleted_before_scheduled 1" in out and "cpu_only" not in out
    assert "<1 (shared)" in out and "fractional jobs   1" in out and "CPU-only jobs     1" in out


def test_info_without_durations(run):
    code, out, _ = run("info", str(DATA / "openb_inflate_small.csv"))
    assert code == 0 and "unknown duration  4" in out and "p50" not in out


def test_convert_round_trips(run, tmp_path):
    out_file = tmp_path / "h.csv"
    code, out, _ = run(
        "convert", str(DATA / "helios_small.csv"), "--format", "helios", "--out", str(out_file)
    )
    assert code == 0 and "wrote 3 jobs" in out and "cpu_only 1" in out
    assert load_trace(out_file).jobs == load_trace(DATA / "helios_small.csv").jobs


def test_generate_is_reproducible(run, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert run("generate", "--jobs", "250", "--seed", "3", "--out", str(a))[0] == 0
    assert run("generate", "--jobs", "250", "--seed", "3", "--out", str(b))[0] == 0
    assert a.read_bytes() == b.read_bytes()
    assert len(load_trace(a, "canonical").jobs) == 250


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("info", "missing.csv"), "no such file"),
        (("info", str(DATA / "openb_nodes_small.csv")), "node list"),
        (("info", str(DATA / "philly_small.csv"), "--format", "helios"), "missing column"),
        (("generate", "--jobs", "-5", "--out", "x.csv"), "at least 0"),
        (("generate", "--jobs", "5", "--out", "/nonexistent-dir/x.csv"), "cannot write"),
    ],
)
def test_errors_are_one_line_and_exit_2(run, args, words):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert err.startswith("analysim trace: error: ") and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_row_is_reported_with_place(run, tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,sixty,1,66.0,a\n")
    code, _, err = run("info", str(p))
    assert code == 2 and f"{p}, line 2, column 'duration': expected a number" in err


def test_usage_errors_exit_2(run):
    assert run("convert", str(DATA / "philly_small.csv"))[0] == 2  # --out missing
    assert run("info", "x.csv", "--format", "slurm")[0] == 2
