"""A generic reflection client, as grpcurl is one: it asks ``grpc.reflection.<version>`` by its
method path. v1 and v1alpha share every message field for field, so v1alpha's classes encode
either version's bytes."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as rpb


def _ask(channel: grpc.Channel, version: str, request: rpb.ServerReflectionRequest,
         metadata: tuple = ()) -> rpb.ServerReflectionResponse:
    call = channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                                 request_serializer=rpb.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=rpb.ServerReflectionResponse.FromString)
    (response,) = list(call(iter([request]), timeout=10, metadata=metadata or None))
    assert not response.HasField("error_response"), response.error_response
    return response


def reflected_services(channel: grpc.Channel, version: str, metadata: tuple = ()) -> set[str]:
    r = _ask(channel, version, rpb.ServerReflectionRequest(list_services=""), metadata)
    return {s.name for s in r.list_services_response.service}


def reflected_file_package(channel: grpc.Channel, version: str, symbol: str, metadata: tuple = ()) -> str:
    """The package of the file that defines ``symbol``, as reflection describes it."""
    r = _ask(channel, version, rpb.ServerReflectionRequest(file_containing_symbol=symbol), metadata)
    f = descriptor_pb2.FileDescriptorProto.FromString(r.file_descriptor_response.file_descriptor_proto[0])
    return f.package
