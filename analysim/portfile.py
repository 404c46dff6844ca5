"""Port files: a service writes the addresses it bound (JSON) once listening, so that a
launcher, a test or a sidecar started with port 0 can find it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path


def write_port_file(path: str | Path, ports: Mapping[str, object]) -> None:
    """Atomically (write, then rename), so a watcher never reads half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(ports)))
    os.replace(tmp, path)
