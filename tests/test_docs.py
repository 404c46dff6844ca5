"""Executable docs: every command block of README.md and docs/*.md runs as a reader would run it
(tests/docs_blocks.py says how, and how a block is marked not to run), the Python client
examples against a real scheduler, and every sample output shown is what its command prints now
(``make docs-samples`` rewrites a stale one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysim.tls import TlsFiles
from tests.docs_blocks import (
    DOCS,
    ROOT,
    SHARED,
    Block,
    blocks,
    failure,
    folder,
    run_block,
    run_sample,
    runnable,
    same_sample,
)
from tests.test_live_helpers import live
from tests.tlscerts import CA

SCHEDULER_TARGET = "127.0.0.1:50051"


def _scheduler_block(b: Block, work: Path) -> None:
    """The block against a scheduler with mutual TLS and tokens, and one agent, on the philly
    cluster, paced at an hour of virtual time per second (a job of the example ends in about a second)."""
    ca = CA(work, "ca")
    server, client = ca.issue("scheduler"), ca.issue("client")
    (work / "client.crt").write_text(Path(client.cert).read_text())
    (work / "client.key").write_text(Path(client.key).read_text())
    tls = TlsFiles(ca=ca.files.cert, cert=client.cert, key=client.key)
    args = ["--jobs", "0", "--speed", "3600", "--tls-cert", server.cert, "--tls-key", server.key,
            "--tls-ca", ca.files.cert]
    with live(work.parent / "scheduler", args, "philly", 64, agents=1, tls=tls) as (run, _):
        (work / "client.token").write_text((run.token_dir / "client.token").read_text())
        r = run_block(b, work, {SCHEDULER_TARGET: run.target})
    assert r.returncode == 0, failure(b, r)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_runs_and_every_sample_is_fresh(path: Path) -> None:
    found = runnable(path)
    if not found:
        pytest.skip(f"{path.name}: no command block")
    skipped: list[str] = []
    with folder() as work:
        for b in found:
            if b.needs_shared and not SHARED.is_dir():
                skipped.append(f"{b.where} (needs {SHARED})")
                continue
            if b.directive == "sample":
                fresh = run_sample(b, work)
                assert same_sample(b.text, fresh), (
                    f"{b.where}: the sample is stale (make docs-samples rewrites it); {b.arg} now prints:\n{fresh}")
            elif b.directive == "scheduler":
                _scheduler_block(b, work)
            else:
                r = run_block(b, work)
                assert r.returncode == 0, failure(b, r)
    if skipped:
        pytest.skip("ran the rest; skipped " + ", ".join(skipped))


def test_every_skipped_block_says_why() -> None:
    for path in DOCS:
        for b in blocks(path):
            if b.directive == "skip":
                assert len(b.arg) > 10, f"{b.where}: a skipped block needs its reason"
            if b.directive == "sample":
                assert not b.lang and b.arg, f"{b.where}: a sample is an output block with its command"
