"""The bookie's gRPC method table: the generated registration, with the
Add stream's frames taken as raw bytes and ReadRange's frames sent as the
handler encoded them (bookie/wire.py: no protobuf copies of either), and a
request protobuf cannot parse answered with a typed BAD_REQUEST instead of
grpc's UNKNOWN and a traceback (``Undecodable``)."""
from __future__ import annotations

import grpc

from bookie import wire
from bookie.core import Status
from bookstream_pb import bookie_pb2 as pb
from bookstream_pb import bookie_pb2_grpc as pb_grpc


class Undecodable:
    """What a request that protobuf could not parse reaches a handler as
    (instead of grpc's UNKNOWN status and a traceback in the log)."""

    __slots__ = ("error",)

    def __init__(self, error: str):
        self.error = error


def _lenient(deserialize):
    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as e:  # DecodeError, or anything else protobuf raises on junk
            return Undecodable(str(e))
    return parse


def _refusing_undecodable(handler, response_cls):
    """A unary-request handler that answers an Undecodable request with
    BAD_REQUEST in the method's own response (INVALID_ARGUMENT where the
    response has no status field) and passes any other to the service."""
    has_status = "status" in response_cls.DESCRIPTOR.fields_by_name

    def refusal(req: Undecodable):
        return response_cls(status=Status.BAD_REQUEST, message=f"undecodable request: {req.error}")

    async def abort(req: Undecodable, context):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {req.error}")

    if handler.response_streaming:
        inner = handler.unary_stream

        async def unary_stream(request, context):
            if isinstance(request, Undecodable):
                if not has_status:
                    await abort(request, context)
                yield refusal(request)
                return
            async for resp in inner(request, context):
                yield resp
        return handler._replace(request_deserializer=_lenient(handler.request_deserializer),
                                unary_stream=unary_stream)
    inner = handler.unary_unary

    async def unary_unary(request, context):
        if isinstance(request, Undecodable):
            if not has_status:
                await abort(request, context)
            return refusal(request)
        return await inner(request, context)
    return handler._replace(request_deserializer=_lenient(handler.request_deserializer), unary_unary=unary_unary)


def register(service: "BookieService", server) -> None:
    """The generated registration, except that the Add stream's frames reach
    the service as raw bytes and ReadRange's frames leave it as bytes the
    handler encoded (bookie/wire.py: no protobuf copies of them), and that an
    undecodable request to any other method gets a typed BAD_REQUEST
    (``Undecodable``)."""
    handlers: dict = {}

    class _Collect:
        def add_generic_rpc_handlers(self, generic) -> None:
            pass

        def add_registered_method_handlers(self, name, by_method) -> None:
            handlers[name] = dict(by_method)

    pb_grpc.add_BookieServicer_to_server(service, _Collect())
    (name, by_method), = handlers.items()
    add = by_method["Add"]
    by_method["Add"] = grpc.stream_stream_rpc_method_handler(
        add.stream_stream, request_deserializer=None, response_serializer=add.response_serializer)
    rr = by_method["ReadRange"]   # frames encoded by the handler (wire.encode_range_frame) go as they are
    by_method["ReadRange"] = grpc.unary_stream_rpc_method_handler(
        rr.unary_stream, request_deserializer=rr.request_deserializer,
        response_serializer=wire.serialize_range_response)
    methods = pb.DESCRIPTOR.services_by_name["Bookie"].methods_by_name
    for method, handler in by_method.items():
        if method != "Add":
            response_cls = getattr(pb, methods[method].output_type.name)
            by_method[method] = _refusing_undecodable(handler, response_cls)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, by_method),))
    server.add_registered_method_handlers(name, by_method)
