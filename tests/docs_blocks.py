"""The command blocks of README.md and docs/*.md, run as a reader would run them, and the sample
outputs they show, regenerated from the commands that print them.

Every ```sh, ```bash and ```python block runs, in order per file, in one fresh temporary folder
(``work/``, with ``../shared`` beside it when the repository has one and the repository's
``examples/`` in it), against the installed
package (the interpreter's ``bin/`` first on PATH). An HTML comment on the line just before a
fence says otherwise (GitHub does not render it):

    <!-- docs-test: skip: REASON -->        not run: only what no test here can have (a Kubernetes
                                            API server, Slurm, the make targets that are this suite)
    <!-- docs-test: sample: COMMAND -->     the block is COMMAND's output (stdout), run after the
                                            blocks above it; ``make docs-samples`` rewrites it
    <!-- docs-test: MODE [MODE ...] -->     the block runs with what its MODEs give it:

    scheduler   (python) against a real scheduler and one agent: the philly cluster, mutual TLS
                and tokens, its client.token, ca.crt, client.crt/key in the folder,
                127.0.0.1:50051 in the block pointed at its port
    serve       its servers (analysim gateway, the monitor service, the scheduler service, agents)
                run in the background on ephemeral ports, the lines after each one wait until it
                serves and reach it at the port the block names; at the end each gets SIGTERM and
                must exit 0 (tests/docs_serve.py)
    postgres    every postgresql:// URL in it is one fresh database of a real PostgreSQL
                (tests/pg.py, the suite's own)
    ray         $RAY_ADDRESS (and the token) of a real local Ray head (tests/rayhead.py)
    render      ``docker compose ... up`` and ``kubectl`` render and validate what they would
                start or apply instead of acting on a runtime or a cluster (tests/docs_render.py
                says exactly what each checks); ``deploy/`` is the repository's (a link)
    synopsis    a usage line with placeholders and [optional] parts, not run: every --option it
                names must be one its command's --help lists

A block that reads ``../shared`` is skipped when the repository has none. A sample's lines may
differ from the fresh output only where a ``VARIES`` pattern matches (wall times).

    python -m tests.docs_blocks            # rewrite every stale sample (make docs-samples)
    python -m tests.docs_blocks --check    # exit 1 if one is stale
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh": "sh", "bash": "sh", "python": "python"}
BLOCK_TIMEOUT_S = 300
# What may differ between a committed sample and a fresh run: wall-clock times.
VARIES = [re.compile(r"ran in [0-9.]+ s")]
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!-- docs-test: ([a-z ]+?)(?:: (.*?))? -->$")
MODES = ("scheduler", "serve", "postgres", "ray", "render", "synopsis")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str  # "sh", "python" or "" (output)
    text: str
    directive: str = ""  # skip, sample or ""
    arg: str = ""  # the skip's reason, the sample's command
    end: int = 0  # the closing fence's line
    modes: frozenset[str] = frozenset()  # of MODES

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def needs_shared(self) -> bool:
        return "../shared" in self.text or "../shared" in self.arg


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        directive, arg, modes = _directive(path, start, lines[start - 1] if start else "")
        out.append(Block(path, start + 1, RUN.get(m.group(1), ""), "\n".join(lines[start + 1:i]) + "\n",
                         directive, arg, i + 1, modes))
        i += 1
    return out


def _directive(path: Path, fence: int, line: str) -> tuple[str, str, frozenset[str]]:
    """What the comment before a fence says: (skip|sample|"", its argument, the modes)."""
    if not line.startswith("<!-- docs-test"):
        return "", "", frozenset()
    d = _DIRECTIVE.match(line)
    words = d.group(1).split() if d else []
    if d and words in (["skip"], ["sample"]) and d.group(2):
        return words[0], d.group(2), frozenset()
    if d and words and not d.group(2) and set(words) <= set(MODES):
        return "", "", frozenset(words)
    raise ValueError(f"{path.relative_to(ROOT)}:{fence}: not a docs-test directive: {line!r} "
                     f"(skip: REASON, sample: COMMAND, or modes from {', '.join(MODES)})")


def runnable(path: Path) -> list[Block]:
    """The blocks that run or are checked: commands not skipped, and samples."""
    return [b for b in blocks(path) if (b.lang and b.directive != "skip") or b.directive == "sample"]


def environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANALYSIM_", "RAY_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(work.parent / "tmp")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def folder() -> Iterator[Path]:
    """A fresh ``work/`` with ``../shared`` beside it (a link) when the repository has one, and the
    repository's ``examples/`` in it (a link), as a reader in a checkout has them."""
    with tempfile.TemporaryDirectory(prefix="analysim-docs-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "examples").symlink_to(ROOT / "examples")
        (Path(tmp) / "tmp").mkdir()
        if SHARED.is_dir():
            (Path(tmp) / "shared").symlink_to(SHARED)
        yield work


def run_block(b: Block, work: Path, replace: dict[str, str] | None = None, text: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The block (or ``text`` in its place), with ``replace``'s strings replaced, in ``env``."""
    text = b.text if text is None else text
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    if b.lang == "python":
        argv = [sys.executable, "-c", text]
    else:
        argv = ["bash", "-e", "-u", "-o", "pipefail", "-c", text]
    return subprocess.run(argv, cwd=work, env=env or environment(work), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)


def run_sample(b: Block, work: Path) -> str:
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.arg], cwd=work, env=environment(work),
                       capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError(f"{b.where}: the sample's command {b.arg!r} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def _masked(line: str) -> str:
    for p in VARIES:
        line = p.sub("…", line)
    return line


def same_sample(committed: str, fresh: str) -> bool:
    a, b = committed.rstrip("\n").splitlines(), fresh.rstrip("\n").splitlines()
    return len(a) == len(b) and all(_masked(x) == _masked(y) for x, y in zip(a, b, strict=True))


def failure(b: Block, r: subprocess.CompletedProcess) -> str:
    return (f"{b.where}: the {b.lang} block failed (exit {r.returncode}):\n{b.text}\n--- stdout (end)\n"
            f"{r.stdout[-2000:]}\n--- stderr (end)\n{r.stderr[-3000:]}")


def regenerate(path: Path, check: bool) -> list[str]:
    """Run ``path``'s blocks up to its last sample; rewrite (or with ``check``, list) stale samples."""
    found = runnable(path)
    samples = [b for b in found if b.directive == "sample"]
    if not samples:
        return []
    if any(b.needs_shared for b in found[:found.index(samples[-1]) + 1]) and not SHARED.is_dir():
        raise SystemExit(f"{path.relative_to(ROOT)}: its samples need {SHARED}")
    stale: list[tuple[Block, str]] = []
    with folder() as work:
        for b in found[:found.index(samples[-1]) + 1]:
            if b.directive == "sample":
                fresh = run_sample(b, work)
                if not same_sample(b.text, fresh):
                    stale.append((b, fresh))
            elif not b.modes:  # blocks that need servers, databases or clusters make no sample
                r = run_block(b, work)
                if r.returncode != 0:
                    raise SystemExit(failure(b, r))
    if not check and stale:
        lines = path.read_text().splitlines(keepends=True)
        for b, fresh in reversed(stale):  # from the end: earlier line numbers stay right
            lines[b.line:b.end - 1] = [fresh if fresh.endswith("\n") else fresh + "\n"]
        path.write_text("".join(lines))
    return [f"{b.where}: {'stale' if check else 'rewritten'}" for b, _ in stale]


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    said = [line for path in DOCS for line in regenerate(path, check)]
    for line in said:
        print(line)
    if not said:
        print("every sample is up to date")
    return 1 if check and said else 0


if __name__ == "__main__":
    raise SystemExit(main())
