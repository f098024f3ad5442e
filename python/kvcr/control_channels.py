"""The peer control channel's endpoint, as frameworks configure it.

The ZeroMQ control plane itself runs inside libkvcr's progress thread; it
arrives with the peer-to-peer tier, which is not built yet. Until then this
object describes the endpoint, and send() reports that nothing was sent."""
from __future__ import annotations


class ZmqPeerControlChannel:
    def __init__(self, bind_host: str, bind_port: int, advertise_host: str | None = None) -> None:
        if type(bind_port) is not int or not 1 <= bind_port <= 65535:
            raise ValueError("control port must be between 1 and 65535")
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.advertise_host = advertise_host or bind_host
        self.endpoint = f"tcp://{self.advertise_host}:{bind_port}"
        self.closed = False

    def send(self, endpoint: str, message: bytes) -> bool:
        return False  # no peer-to-peer tier yet: nothing is ever sent

    def recv(self) -> list:
        return []

    def close(self) -> None:
        self.closed = True
