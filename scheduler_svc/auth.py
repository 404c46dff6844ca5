"""Who may call what on the scheduler: bearer tokens in gRPC metadata, one set per role.

- **agent**: ``AgentService`` (Register, Connect), and only for the nodes its token was
  provisioned for;
- **client**: submit, cancel, get, list, watch, cluster state, summary;
- **operator**: everything a client may, plus the clock (Pause, Resume, SetSpeed).

Health checking and reflection stay open (probes; the schema is public). Tokens are kept as
SHA-256 digests and compared in constant time against every known one. A call without a
known token is UNAUTHENTICATED; a known token of the wrong role is PERMISSION_DENIED.

Token files: one token per line (``#`` comments and blank lines skipped). An agent token line
may name the nodes it may register after the token: ``TOKEN node-0000..node-0007,node-0012``
(ranges in the cluster's node order); a bare token may register any node.

Rotation: the files are watched (their size, mtime and inode, looked at on any unknown token
and at most every ``RECHECK_S`` otherwise) and re-read when they change, and on SIGHUP: a new
token works from its first call, an old one stops within ``RECHECK_S``, and no restart is
needed. A file caught half-written keeps the previous tokens until it reads whole."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from analysim import rpc_status
from analysim.errors import UserError
from analysim.tokens import token_lines

log = logging.getLogger("scheduler_svc")
AGENT, CLIENT, OPERATOR = "agent", "client", "operator"
RECHECK_S = 1.0
_SCHED = "/analysim.v1.SchedulerService/"
_AGENT = "/analysim.v1.AgentService/"
CLIENT_METHODS = ("SubmitJob", "CancelJob", "GetJob", "ListJobs", "WatchEvents", "GetClusterState", "GetSummary",
                  "ExplainJob")
OPERATOR_METHODS = ("Pause", "Resume", "SetSpeed")
METHOD_ROLES: dict[str, frozenset[str]] = {
    **{_SCHED + m: frozenset((CLIENT, OPERATOR)) for m in CLIENT_METHODS},
    **{_SCHED + m: frozenset((OPERATOR,)) for m in OPERATOR_METHODS},
    _AGENT + "Register": frozenset((AGENT,)),
    _AGENT + "Connect": frozenset((AGENT,)),
}
PROTECTED_PREFIXES = (_SCHED, _AGENT)  # a method of these services missing above is refused


@dataclass(frozen=True)
class Principal:
    role: str  # what the token may do: agent, client or operator
    name: str  # which token: "<file>:<line>"
    nodes: frozenset[str] | None = None  # agents: the nodes it may register (None: any)


def new_token() -> str:
    return secrets.token_urlsafe(32)


AGENT_TOKENS, CLIENT_TOKEN, OPERATOR_TOKEN = "agents.tokens", "client.token", "operator.token"


def agent_token_name(index: int) -> str:
    return f"agent-{index}.token"


def _secret(path: Path, text: str) -> None:
    """``path`` (mode 600) replaced by rename: a scheduler or agent re-reading it sees the old
    file or the new one, never a half-written one."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def write_tokens(directory: str | Path, node_names: Sequence[str], agents: int, keep: bool = False) -> Path:
    """Fresh credentials in ``directory`` (mode 700, files 600): ``agents.tokens`` (the
    scheduler's list: each agent's token and the nodes of its slice, as ``split_nodes`` cuts
    them), ``agent-<i>.token``, ``client.token``, ``operator.token``. With ``keep``, files that
    already hold the same slices are left as they are (a restarted init job must not change the
    tokens of services that are running)."""
    from analysim.clusters import split_nodes

    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    slices = [f"{node_names[first]}..{node_names[first + count - 1]}"
              for first, count in split_nodes(len(node_names), agents)]
    names = [AGENT_TOKENS, CLIENT_TOKEN, OPERATOR_TOKEN, *map(agent_token_name, range(len(slices)))]
    if keep and all((d / n).is_file() for n in names):
        try:
            if [line.split(None, 1)[1:] for _, line in token_lines(d / AGENT_TOKENS)] == [[s] for s in slices]:
                return d
        except UserError:
            pass  # unreadable: written again below
    lines = []
    for i, nodes in enumerate(slices):
        tok = new_token()
        _secret(d / agent_token_name(i), tok + "\n")
        lines.append(f"{tok} {nodes}")
    _secret(d / AGENT_TOKENS, "\n".join(lines) + "\n")
    for name in (CLIENT_TOKEN, OPERATOR_TOKEN):
        _secret(d / name, new_token() + "\n")
    for stale in d.glob("agent-*.token"):  # of agents beyond the new count: no longer valid
        if stale.name not in names:
            stale.unlink()
    return d


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _node_set(spec: str, order: Sequence[str], where: str) -> frozenset[str]:
    index = {n: i for i, n in enumerate(order)}
    out: set[str] = set()
    for part in spec.split(","):
        a, sep, b = part.strip().partition("..")
        for name in (a, b) if sep else (a,):
            if name not in index:
                raise UserError(f"{where}: node {name!r} is not in the cluster")
        out.update(order[index[a]: index[b] + 1] if sep else (a,))
    return frozenset(out)


class Authenticator:
    """The known tokens and what each may do; the token files are followed (module docstring)."""

    def __init__(self) -> None:
        self._known: list[tuple[bytes, Principal]] = []  # (token digest, who it is), from every file
        self._files: list[tuple[str, str | Path, Sequence[str]]] = []  # (role, path, node order) of each file
        self._stamp: tuple = ()  # each file's (inode, size, mtime) when last read: a change means re-read
        self._checked = 0.0  # wall (monotonic) time the files' stamps were last compared

    @property
    def enabled(self) -> bool:
        return bool(self._known)

    def add_file(self, role: str, path: str | Path, node_order: Sequence[str] = ()) -> None:
        self._known += _read(role, path, node_order)
        self._files.append((role, path, node_order))
        self._stamp = self._stamps()

    def _stamps(self) -> tuple:
        out: list[tuple[int, int, int] | None] = []
        for _, path, _ in self._files:
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def reload(self, why: str = "changed") -> bool:
        """Read the token files again; True if they held another set. A file that cannot be
        read whole keeps the current tokens (logged), and is tried again at the next check."""
        stamp = self._stamps()
        try:
            known = [k for role, path, order in self._files for k in _read(role, path, order)]
        except UserError as e:
            log.error("token files %s, but not re-read (%s): the previous tokens stay valid", why, e)
            return False
        self._stamp = stamp
        changed = [d for d, _ in known] != [d for d, _ in self._known]
        self._known = known
        log.warning("token files %s: re-read, %d token(s)%s", why, len(known), "" if changed else ", the same ones")
        return changed

    def _maybe_reload(self, force: bool) -> None:
        now = time.monotonic()
        if not self._files or (not force and now - self._checked < RECHECK_S):
            return
        self._checked = now
        if self._stamps() != self._stamp:
            self.reload()

    def identify(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal | None:
        self._maybe_reload(force=False)
        found = self._match(metadata)
        if found is None:
            self._maybe_reload(force=True)  # a token just rotated in: no window where it is refused
            found = self._match(metadata)
        return found

    def _match(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal | None:
        presented = ""
        for k, v in metadata or ():
            if k == "authorization" and isinstance(v, str) and v.startswith("Bearer "):
                presented = v[7:]
        d = _digest(presented)
        found = None
        for digest, p in self._known:  # every entry, whatever matches: constant time
            if hmac.compare_digest(d, digest) and found is None:
                found = p
        return found if presented else None


def _read(role: str, path: str | Path, node_order: Sequence[str]) -> list[tuple[bytes, Principal]]:
    lines = token_lines(path)
    if not lines:
        raise UserError(f"--{role}-token-file {path}: no token in the file")
    out = []
    for lineno, line in lines:
        token, *rest = line.split(None, 1)
        where = f"{path}, line {lineno}"
        if len(token) < 16:
            raise UserError(f"{where}: a token must be at least 16 characters")
        nodes = None
        if rest and role == AGENT:
            nodes = _node_set(rest[0], node_order, where)
        elif rest:
            raise UserError(f"{where}: only agent tokens take a node list")
        out.append((_digest(token), Principal(role, where, nodes)))
    return out


def _refuse(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str,
            reason: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers with an error (a rich status
    with ErrorInfo(reason), like every refusal of the scheduler)."""
    async def unary(request, context):  # noqa: ANN001, ANN202
        await rpc_status.abort(context, code, message, reason=reason, domain=rpc_status.SCHEDULER_DOMAIN)

    async def stream(request, context):  # noqa: ANN001, ANN202
        await rpc_status.abort(context, code, message, reason=reason, domain=rpc_status.SCHEDULER_DOMAIN)
        yield  # pragma: no cover — makes this an async generator

    kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **kw)
    return grpc.stream_stream_rpc_method_handler(stream, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth: Authenticator, refused: Callable[[str], None] = lambda code: None) -> None:
        self.auth = auth  # who the calls' tokens are
        self.refused = refused  # counts a refused call, by reason

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith(PROTECTED_PREFIXES):
            return handler
        who = self.auth.identify(details.invocation_metadata)
        if who is None:
            self.refused("unauthenticated")
            return _refuse(handler, grpc.StatusCode.UNAUTHENTICATED,
                           "a bearer token is required (metadata 'authorization: Bearer <token>')", "unauthenticated")
        if who.role not in METHOD_ROLES.get(method, ()):
            self.refused("permission_denied")
            return _refuse(handler, grpc.StatusCode.PERMISSION_DENIED,
                           f"a {who.role} token may not call {method.rsplit('/', 1)[-1]}", "wrong_role")
        return handler


