"""The peer control channel that frameworks pass as `framework_control`.

The ZeroMQ control plane belongs to the peer-to-peer tier, which is not
built yet (and pyzmq is not required). Until then this object validates and
describes the endpoint with the surface KVCR uses (endpoint, send, recv,
close); it binds nothing, send() reports that nothing was sent and recv()
returns no messages."""
from __future__ import annotations


class ZmqPeerControlChannel:
    def __init__(self, bind_host: str, bind_port: int, advertise_host: "str | None" = None) -> None:
        if not isinstance(bind_host, str) or not bind_host:
            raise ValueError("control bind host must be a non-empty string")
        if type(bind_port) is not int or not 1 <= bind_port <= 65535:
            raise ValueError("control port must be between 1 and 65535")
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.advertise_host = advertise_host or bind_host
        host = self.advertise_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        self.endpoint = f"tcp://{host}:{bind_port}"
        self.closed = False

    def initialize(self) -> None:
        """Nothing to set up until the peer-to-peer tier exists."""

    def send(self, endpoint: str, message: bytes) -> bool:
        return False  # no peer-to-peer tier yet: nothing is ever sent

    def recv(self) -> list:
        return []

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"ZmqPeerControlChannel({self.endpoint!r}, not connected: peer tier not built)"
