"""Refusals as rich gRPC statuses (google.rpc.Status with ErrorInfo and BadRequest details),
one way for the scheduler, the gateway and their clients.

A refusal says what a program needs in the details (``ErrorInfo.reason``, a stable
snake_case code; ``ErrorInfo.metadata["field"]`` and a ``BadRequest`` field violation when
one field is at fault) and what a person needs in the message."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

SCHEDULER_DOMAIN = "scheduler.analysim"
GATEWAY_DOMAIN = "gateway.analysim"


def status_proto(code: grpc.StatusCode, message: str, *, reason: str, domain: str,
                 field: str | None = None) -> status_pb2.Status:
    """The google.rpc.Status of a refusal."""
    details = [error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata={"field": field} if field else {})]
    if field and code is grpc.StatusCode.INVALID_ARGUMENT:
        violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=message)
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return status_pb2.Status(code=code.value[0], message=message, details=packed)


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str, *, reason: str,
                domain: str, field: str | None = None) -> NoReturn:
    """End the call with a rich status (the message stays the status's one-line details)."""
    await context.abort_with_status(rpc_status.to_status(
        status_proto(code, message, reason=reason, domain=domain, field=field)))
    raise AssertionError("abort_with_status returned")  # it raises; this tells type checkers


def refusal_fields(status: status_pb2.Status | Any) -> dict[str, Any]:
    """``{"code": reason, "message": ..., "field": ...}`` ("field" only when one is at fault)
    from a google.rpc.Status, or a message with its wire format such as a PredictStream
    ErrorStatus: the fields of the REST error body."""
    if not isinstance(status, status_pb2.Status):
        status = status_pb2.Status.FromString(status.SerializeToString())
    out: dict[str, Any] = {"code": "", "message": status.message}
    for a in status.details:
        if a.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            a.Unpack(info)
            out["code"] = info.reason
            if "field" in info.metadata:
                out["field"] = info.metadata["field"]
    return out


def refusal_of(e: grpc.RpcError) -> dict[str, Any]:
    """The refusal fields of a failed call (code "" when it carried no ErrorInfo)."""
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    if status is None:
        return {"code": "", "message": e.details()}  # type: ignore[attr-defined]
    return refusal_fields(status)
