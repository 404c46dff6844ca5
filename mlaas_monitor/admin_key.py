"""Where the admin key comes from: ANALYSIM_ADMIN_KEY or a file, never a default."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from analysim.errors import UserError
from mlaas_monitor.auth import admin_key_problem

ENV_VAR = "ANALYSIM_ADMIN_KEY"


def load_admin_key(env: Mapping[str, str], key_file: str | None) -> str:
    if key_file:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read the admin key file {key_file}: {e}") from e
        source = key_file
    elif env.get(ENV_VAR):
        key, source = env[ENV_VAR].strip(), ENV_VAR
    else:
        raise UserError(f"no admin key: set {ENV_VAR} or pass --admin-key-file (there is no default)")
    problem = admin_key_problem(key)
    if problem is not None:
        raise UserError(f"the admin key from {source} is {problem}")
    return key
