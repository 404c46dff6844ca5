"""SQLite's write-ahead log read as SQLite's recovery reads it, to tell the committed transactions
that recovery would silently drop (the journal refuses to resume from such a file)."""

from __future__ import annotations

import struct

WAL_MAGIC_LE, WAL_MAGIC_BE = 0x377F0682, 0x377F0683  # checksums in little- or big-endian words


def _wal_checksum(b: bytes, magic: int, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    words = struct.unpack(f"{'<' if magic == WAL_MAGIC_LE else '>'}{len(b) // 4}I", b)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_dropped(wal: bytes) -> str | None:
    """Committed transactions that SQLite's recovery would drop: it follows the WAL's checksum
    chain (frames with the header's salts, each checksum over the previous one) and stops at
    the first frame that breaks it. Frames after that with the header's salts that end a
    transaction were committed, and are lost. (Frames of an older generation, left after a
    checkpoint restarted the WAL, carry other salts; trailing frames without a commit frame
    were never committed.)"""
    if len(wal) < 32:
        return "its WAL header is damaged (a short file)" if any(wal) else None
    magic, _version, page_size, _ckpt, salt1, salt2, c1, c2 = struct.unpack(">8I", wal[:32])
    if magic not in (WAL_MAGIC_LE, WAL_MAGIC_BE) or _wal_checksum(wal[:24], magic) != (c1, c2):
        return "its WAL header is damaged, so SQLite would ignore every transaction in the WAL" if any(wal) else None
    frame = 24 + page_size
    n = (len(wal) - 32) // frame
    s, used = (c1, c2), 0
    while used < n:
        off = 32 + used * frame
        _pgno, _commit, s1, s2, k1, k2 = struct.unpack(">6I", wal[off:off + 24])
        if (s1, s2) != (salt1, salt2):
            break
        s = _wal_checksum(wal[off + 24:off + frame], magic, *_wal_checksum(wal[off:off + 8], magic, *s))
        if s != (k1, k2):
            break
        used += 1
    commits = 0
    for i in range(used, n):
        off = 32 + i * frame
        _pgno, commit, s1, s2 = struct.unpack(">4I", wal[off:off + 16])
        if (s1, s2) == (salt1, salt2) and commit:
            commits += 1
    if commits:
        return (f"its WAL is damaged after frame {used} of {n}: SQLite's recovery stops there, dropping "
                f"{commits} committed transaction(s) after it")
    return None
