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
(ranges in the cluster's node order); a bare token may register any node."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from analysim.errors import UserError

AGENT, CLIENT, OPERATOR = "agent", "client", "operator"
_SCHED = "/analysim.v1.SchedulerService/"
_AGENT = "/analysim.v1.AgentService/"
CLIENT_METHODS = ("SubmitJob", "CancelJob", "GetJob", "ListJobs", "WatchEvents", "GetClusterState", "GetSummary")
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
    role: str
    name: str  # which token: "<file>:<line>"
    nodes: frozenset[str] | None = None  # agents: the nodes it may register (None: any)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def read_token(path: str | Path) -> str:
    """The first token of a token file (what a client or an agent presents)."""
    for line in _lines(path):
        return line[1].split()[0]
    raise UserError(f"{path}: no token in the file")


def _lines(path: str | Path) -> list[tuple[int, str]]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(f"token file {path}: cannot read ({e.strerror})") from None
    return [(i, s) for i, raw in enumerate(text.splitlines(), 1) if (s := raw.split("#", 1)[0].strip())]


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
    """The known tokens and what each may do."""

    def __init__(self) -> None:
        self._known: list[tuple[bytes, Principal]] = []

    @property
    def enabled(self) -> bool:
        return bool(self._known)

    def add_file(self, role: str, path: str | Path, node_order: Sequence[str] = ()) -> None:
        lines = _lines(path)
        if not lines:
            raise UserError(f"--{role}-token-file {path}: no token in the file")
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
            self._known.append((_digest(token), Principal(role, where, nodes)))

    def identify(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal | None:
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


def _refuse(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers with an error."""
    async def unary(request, context):  # noqa: ANN001, ANN202
        await context.abort(code, message)

    async def stream(request, context):  # noqa: ANN001, ANN202
        await context.abort(code, message)
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
        self.auth = auth
        self.refused = refused

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
                           "a bearer token is required (metadata 'authorization: Bearer <token>')")
        if who.role not in METHOD_ROLES.get(method, ()):
            self.refused("permission_denied")
            return _refuse(handler, grpc.StatusCode.PERMISSION_DENIED,
                           f"a {who.role} token may not call {method.rsplit('/', 1)[-1]}")
        return handler


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying ``token`` (nothing when None)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
