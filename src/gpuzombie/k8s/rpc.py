"""One line for a failed gRPC call, shared by the CRI and PodResources clients."""

from __future__ import annotations

import grpc


def describe(exc: grpc.RpcError) -> tuple[str, str]:
    """(status name, one line of details): the OS's reason for an unreachable socket, without
    the resolver's preamble; "no answer in time" for a deadline."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = " ".join(((exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)).split())
    if code == grpc.StatusCode.UNAVAILABLE and "error: " in details:
        details = details.rsplit("error: ", 1)[1]
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = "no answer in time"
    return (code.name if code is not None else "ERROR"), details[:300]
