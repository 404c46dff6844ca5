"""Executable docs: every command block of README.md and docs/*.md runs as a reader would run it
(tests/docs_blocks.py says how, and how a block is marked to run with servers, PostgreSQL, Ray
or rendered deploy tools, or not at all), the Python client examples against a real scheduler,
and every sample output shown is what its command prints now (``make docs-samples`` rewrites a
stale one)."""

from __future__ import annotations

import re
import shlex
import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest

from analysim.tls import TlsFiles
from tests import docs_render
from tests.docs_blocks import (
    BLOCK_TIMEOUT_S,
    DOCS,
    ROOT,
    SHARED,
    Block,
    blocks,
    environment,
    failure,
    folder,
    run_block,
    run_sample,
    runnable,
    same_sample,
)
from tests.docs_serve import run_lines
from tests.rayhead import ray_head
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


def _synopsis(b: Block, work: Path, env: dict[str, str]) -> None:
    words = b.text.split()
    command = words[:next(i for i, w in enumerate(words) if w.startswith(("-", "[")))]
    r = subprocess.run([*command, "--help"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{b.where}: {' '.join(command)} --help failed:\n{r.stderr[-2000:]}"
    known = set(re.findall(r"(?<![\w-])--[\w-]+", r.stdout))
    named = set(re.findall(r"(?<![\w-])--[\w-]+", b.text))
    assert named <= known, f"{b.where}: {' '.join(command)} has no {', '.join(sorted(named - known))}"


class Modes:
    """What a block's modes give it, started when a block of the file first asks: one Ray head per
    file, a fresh PostgreSQL database per block (of the worker's throwaway cluster), the shims."""

    def __init__(self, request: pytest.FixtureRequest, stack: ExitStack, work: Path) -> None:
        self.request, self.stack, self.work = request, stack, work
        self.ray_env: dict[str, str] | None = None
        self.render_env: dict[str, str] | None = None
        self.carried: dict[str, str] = {}  # what earlier shell blocks set (the reader's shell keeps it)

    def prepare(self, b: Block) -> tuple[str, dict[str, str]]:
        text, env = b.text, {**environment(self.work), **self.carried}
        if "postgres" in b.modes:
            url = self.request.getfixturevalue("pg_cluster").new_database()
            text = re.sub(r"postgresql://[^\s'\"]+", lambda _: shlex.quote(url), text)
        if "ray" in b.modes:
            if self.ray_env is None:
                head = self.stack.enter_context(ray_head())
                self.ray_env = {"RAY_ADDRESS": head.address, **{k: v for k, v in head.env.items()
                                                                 if k.startswith("RAY_AUTH")}}
            env.update(self.ray_env)
        if "render" in b.modes:
            if self.render_env is None:
                tmp = self.work.parent / "tmp"
                self.render_env = docs_render.install(tmp / "render-bin", tmp / "render-state.json")
                if not (self.work / "deploy").exists():
                    (self.work / "deploy").symlink_to(ROOT / "deploy")
            env.update(self.render_env)
            env["PATH"] = f"{self.render_env['DOCS_RENDER_BIN']}:{env['PATH']}"
        return text, env

    def run(self, b: Block) -> None:
        text, env = self.prepare(b)
        if "synopsis" in b.modes:
            _synopsis(b, self.work, env)
            return
        if b.lang == "python":
            r = run_block(b, self.work, text=text, env=env)
            assert r.returncode == 0, failure(b, r)
            return
        left = run_lines(b.where, text, self.work, env, BLOCK_TIMEOUT_S, serve="serve" in b.modes)
        self.carried.update({k: v for k, v in left.items() if env.get(k) != v})


# A page's blocks run one after another in one test: README's take 114 s alone on the 2-core test
# machine (its Kueue compare replays 20,000 jobs twice), and went past the suite's 300 s hang guard
# with a third CPU-bound process beside the two workers. Each block keeps its own BLOCK_TIMEOUT_S.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_runs_and_every_sample_is_fresh(path: Path, request: pytest.FixtureRequest) -> None:
    found = runnable(path)
    if not found:
        pytest.skip(f"{path.name}: no command block")
    skipped: list[str] = []
    with folder() as work, ExitStack() as stack:
        modes = Modes(request, stack, work)
        for b in found:
            if b.needs_shared and not SHARED.is_dir():
                skipped.append(f"{b.where} (needs {SHARED})")
                continue
            if b.directive == "sample":
                fresh = run_sample(b, work)
                assert same_sample(b.text, fresh), (
                    f"{b.where}: the sample is stale (make docs-samples rewrites it); {b.arg} now prints:\n{fresh}")
            elif "scheduler" in b.modes:
                _scheduler_block(b, work)
            else:
                modes.run(b)
    if skipped:
        pytest.skip("ran the rest; skipped " + ", ".join(skipped))


def test_every_skipped_block_says_why() -> None:
    for path in DOCS:
        for b in blocks(path):
            if b.directive == "skip":
                assert len(b.arg) > 10, f"{b.where}: a skipped block needs its reason"
            if b.directive == "sample":
                assert not b.lang and b.arg, f"{b.where}: a sample is an output block with its command"
