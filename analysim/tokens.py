"""Bearer-token files and gRPC call metadata, shared by the scheduler (which checks tokens),
its clients and the node agents (which present them), so none imports another's modules.

A token file holds one token per line; ``#`` comments and blank lines are skipped."""

from __future__ import annotations

from pathlib import Path

from analysim.errors import UserError


def token_lines(path: str | Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line of a token file that holds something."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise UserError(f"token file {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"token file {path}: not UTF-8 text (byte {e.start})") from None
    return [(i, s) for i, raw in enumerate(text.splitlines(), 1) if (s := raw.split("#", 1)[0].strip())]


def read_token(path: str | Path) -> str:
    """The first token of a token file (what a client or an agent presents)."""
    for line in token_lines(path):
        return line[1].split()[0]
    raise UserError(f"{path}: no token in the file")


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying ``token`` (nothing when None)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
