"""A deliberately raw Kafka wire client for broker tests: one socket that sends whatever bytes
a test makes (malformed frames included) and no request of its own (no ApiVersions), with
requests built from plain values with ``wire.build``. Framing of responses is the shared
client's (``headrace.client.broker_connection.receive_frame_bytes``)."""

from __future__ import annotations

import socket

from headrace.client.broker_connection import receive_frame_bytes
from headrace.protocol import wire

SOCKET_TIMEOUT_S = 30.0


class RawClient:
    def __init__(self, bootstrap: str, source_host: str | None = None) -> None:
        host, port = bootstrap.rsplit(":", 1)
        source = (source_host, 0) if source_host else None
        self.sock = socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S,
                                             source_address=source)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive_frame(self) -> bytes:
        return bytes(receive_frame_bytes(self.sock))

    def send(self, api_key: int, api_version: int, values: dict) -> int:
        self.correlation_id += 1
        body = wire.build(wire.request_class(api_key, api_version), values)
        self.send_bytes(
            wire.encode_request(api_key, api_version, self.correlation_id, "raw-test", body)
        )
        return self.correlation_id

    def request(self, api_key: int, api_version: int, values: dict):
        correlation_id = self.send(api_key, api_version, values)
        received_id, body = wire.decode_response(api_key, api_version, self.receive_frame())
        assert received_id == correlation_id
        return body
