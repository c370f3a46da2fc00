"""Which GPUs the kubelet gave to which pod's containers: PodResources v1 ``List`` over its unix socket.

Decision: a minimal gRPC client on the standard library (one unary call: HTTP/2 prior knowledge,
HPACK literals out, DATA frames in, a protobuf reader for the three messages we need) rather than a
``grpcio`` dependency. It is about 150 lines, runs in a DaemonSet image with nothing installed, and
is tested against a real grpcio server. Anything unexpected (no socket, a refused call, a slow
kubelet) gives no assignments and one warning: names are a bonus, never required.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_PATH = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIX = "nvidia.com/"

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_WINDOW_UPDATE = 0x8
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
_MAX_WINDOW = 2**31 - 1
_MAX_RESPONSE = 64 * 1024 * 1024


@dataclass(frozen=True)
class DeviceAssignment:
    """One device the kubelet allocated to one container (GPU UUIDs for nvidia.com/gpu)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class PodResources:
    source: str | None
    assignments: tuple[DeviceAssignment, ...] = ()
    warning: str | None = None

    def for_device(self, device_id: str) -> tuple[DeviceAssignment, ...]:
        return tuple(a for a in self.assignments if a.device_id == device_id)


class PodResourcesError(Exception):
    """The call failed; the message is one line."""


# --- protobuf: just enough of the wire format to read ListPodResourcesResponse -------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise PodResourcesError("truncated protobuf varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) for each field; length-delimited values as bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise PodResourcesError("truncated protobuf field")
            yield number, buf[i : i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise PodResourcesError(f"unsupported protobuf wire type {wire}")


def _text(value: bytes | int) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def parse_list_response(message: bytes) -> tuple[DeviceAssignment, ...]:
    """ListPodResourcesResponse{1: PodResources{1 name, 2 namespace, 3 ContainerResources{1 name,
    2 ContainerDevices{1 resource_name, 2 device_ids}}}}."""
    out: list[DeviceAssignment] = []
    for number, pod_buf in _fields(message):
        if number != 1 or not isinstance(pod_buf, bytes):
            continue
        pod = namespace = ""
        containers: list[bytes] = []
        for n, v in _fields(pod_buf):
            if n == 1:
                pod = _text(v)
            elif n == 2:
                namespace = _text(v)
            elif n == 3 and isinstance(v, bytes):
                containers.append(v)
        for c_buf in containers:
            cname = ""
            devices: list[tuple[str, list[str]]] = []
            for n, v in _fields(c_buf):
                if n == 1:
                    cname = _text(v)
                elif n == 2 and isinstance(v, bytes):
                    resource, ids = "", []
                    for dn, dv in _fields(v):
                        if dn == 1:
                            resource = _text(dv)
                        elif dn == 2:
                            ids.append(_text(dv))
                    devices.append((resource, ids))
            out.extend(
                DeviceAssignment(namespace, pod, cname, resource, device_id)
                for resource, ids in devices
                for device_id in ids
            )
    return tuple(out)


# --- HTTP/2: one unary gRPC call --------------------------------------------------------------


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_literal(name: str, value: str) -> bytes:
    """Literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(n), 7) + n + _hpack_int(len(v), 7) + v


def _request_frames(path: str) -> bytes:
    headers = b"".join(
        _hpack_literal(k, v)
        for k, v in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    settings = struct.pack(">HI", 0x2, 0) + struct.pack(">HI", 0x4, _MAX_WINDOW)  # no push; big window
    return (
        _PREFACE
        + _frame(_SETTINGS, 0, 0, settings)
        + _frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", _MAX_WINDOW - 65535))
        + _frame(_HEADERS, _END_HEADERS, 1, headers)
        + _frame(_DATA, _END_STREAM, 1, b"\x00\x00\x00\x00\x00")
    )  # an empty request message


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise PodResourcesError("the kubelet closed the connection")
        buf += chunk
    return bytes(buf)


def grpc_unary(socket_path: str, path: str, *, timeout: float) -> bytes:
    """Call a unary gRPC method with an empty request; the response message's bytes."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            sock.sendall(_request_frames(path))
            body = bytearray()
            while True:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                head = _recv_exact(sock, 9)
                size = int.from_bytes(head[:3], "big")
                kind, flags, stream = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = _recv_exact(sock, size)
                if kind == _SETTINGS and not flags & _ACK:
                    sock.sendall(_frame(_SETTINGS, _ACK, 0))
                elif kind == _PING and not flags & _ACK:
                    sock.sendall(_frame(_PING, _ACK, 0, payload))
                elif kind == _GOAWAY or (kind == _RST_STREAM and stream == 1):
                    raise PodResourcesError("the kubelet reset the call")
                elif kind == _DATA and stream == 1:
                    if flags & _PADDED:
                        payload = payload[1 : len(payload) - payload[0]]
                    body += payload
                    if len(body) > _MAX_RESPONSE:
                        raise PodResourcesError("response too large")
                if stream == 1 and kind in (_DATA, _HEADERS) and flags & _END_STREAM:
                    break
        except TimeoutError:
            raise PodResourcesError(f"no answer within {timeout:g} s") from None
        except OSError as exc:
            raise PodResourcesError(f"cannot talk to {socket_path}: {exc.strerror or exc}") from None
    if len(body) < 5:
        raise PodResourcesError("no response message (the call ended with an error status)")
    if body[0] != 0:
        raise PodResourcesError("compressed gRPC response is not supported")
    size = int.from_bytes(body[1:5], "big")
    return bytes(body[5 : 5 + size])


def list_pod_resources(socket_path: str | None = DEFAULT_SOCKET, *, timeout: float = 2.0) -> PodResources:
    """Device assignments from the kubelet, or none with a warning (none and no warning: no socket)."""
    if not socket_path or not os.path.exists(socket_path):
        return PodResources(source=None)
    try:
        message = grpc_unary(socket_path, LIST_PATH, timeout=timeout)
        return PodResources(source=socket_path, assignments=parse_list_response(message))
    except PodResourcesError as exc:
        return PodResources(source=socket_path, warning=f"kubelet PodResources: {exc}")
