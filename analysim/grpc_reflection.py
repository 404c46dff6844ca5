"""gRPC server reflection under both names generic clients ask for: ``grpc.reflection.v1`` (what
grpcurl, grpcui and Postman try first) and ``grpc.reflection.v1alpha`` (older clients).

grpcio-reflection ships only v1alpha. v1 is the same messages, field for field, under another
package, so one servicer answers both: the v1 method reads and writes the v1alpha classes (the
bytes on the wire are the same), and the v1 file descriptor, v1alpha's renamed, is added to the
pool so that reflection can describe itself under either name."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
SERVICE_NAMES = (V1_SERVICE, reflection.SERVICE_NAME)


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    try:
        pool.FindServiceByName(V1_SERVICE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = proto.package, "grpc.reflection.v1"
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = new
    proto.options.Clear()  # v1alpha's options name its own Java/C# packages
    for message in proto.message_type:
        for f in message.field:
            if f.HasField("type_name"):  # message fields only (setting it on a scalar would mark one)
                f.type_name = f.type_name.replace(f".{old}.", f".{new}.")
    for service in proto.service:
        for m in service.method:
            m.input_type = m.input_type.replace(f".{old}.", f".{new}.")
            m.output_type = m.output_type.replace(f".{old}.", f".{new}.")
    pool.Add(proto)


def add_reflection(server: grpc.Server | grpc.aio.Server,
                   servicer: reflection_pb2_grpc.ServerReflectionServicer) -> None:
    """Serve ``servicer`` (a v1alpha ReflectionServicer, sync or aio, perhaps one that checks
    credentials first) as both v1alpha and v1. Its service names should include SERVICE_NAMES."""
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    _add_v1_descriptor(descriptor_pool.Default())
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1_SERVICE,
                                                                          {"ServerReflectionInfo": method}),))
