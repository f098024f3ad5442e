"""The peer control channel that frameworks pass as `framework_control`.

Giving KVCR a framework_control turns the peer-to-peer tier (REMOTE_G2) on.
libkvcr owns the ZeroMQ sockets (and UCX) itself, so this object only
describes the endpoint: KVCR binds `bind_host:bind_port` and tells peers
`endpoint` ("tcp://<advertise_host>:<port>"). pyzmq is not needed.

`send` and `recv` are kept for frameworks that call them but move nothing:
send() returns False and recv() returns []. A framework_control of another
type works too when it has `bind_host`, `bind_port` and `advertise_host`
attributes, or an `endpoint` "tcp://host:port" (bound and advertised as is).

It also holds the KVCR service's exceptions, raised by
`KVCR(...)` with a guard_config when the claim on the service fails:

* KVCRServiceError — the service refused the claim (libkvcr KVCR_EREFUSED):
  a compatibility digest that does not match, a guard_index out of range, a
  pool group held by another worker, an endpoint that cannot be moved...
  The message is the service's reason.
* KVCRSocketError — the service could not be reached (KVCR_EUNAVAIL: no
  socket, connection refused or closed, a timeout).
* KVCRGuardProtocolError — the service's answer breaks the claim protocol
  or does not fit the claim (KVCR_EPROTO).
* KVCRMsgFramingError — a malformed length-prefixed frame. libkvcr reports
  frame errors with the same code as other protocol errors (KVCR_EPROTO),
  so this build raises KVCRGuardProtocolError for them; the class exists
  for code that catches it.

All are RuntimeError subclasses, and KVCRError (kvcr.errors) ones.
"""
from __future__ import annotations


# The service's errors live in kvcr.errors with the others; here for code
# that imports them from this module.
from .errors import (KVCRGuardProtocolError, KVCRMsgFramingError,  # noqa: E402,F401
                     KVCRServiceError, KVCRSocketError)


class ZmqPeerControlChannel:
    """`bind_port` 0 lets KVCR pick a free port; once a KVCR has bound it,
    `bind_port` names the port chosen and `endpoint` is
    `KVCR.control_endpoint` (with the control lane's port, "#lane=<port>",
    or the CURVE key)."""

    def __init__(self, bind_host: str, bind_port: int, advertise_host: "str | None" = None) -> None:
        if not isinstance(bind_host, str) or not bind_host:
            raise ValueError("control bind host must be a non-empty string")
        if type(bind_port) is not int or not 0 <= bind_port <= 65535:
            raise ValueError("control port must be between 1 and 65535 (or 0: any free port)")
        if advertise_host is not None and (not isinstance(advertise_host, str)
                                           or not advertise_host):
            raise ValueError("control advertise host must be a non-empty string")
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.advertise_host = advertise_host or bind_host
        self.endpoint = self._endpoint(bind_port)
        self.closed = False

    def _endpoint(self, port: int) -> str:
        host = self.advertise_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        return f"tcp://{host}:{port}"

    def _bound(self, endpoint: str) -> None:
        """KVCR bound the channel: `endpoint` is what it tells peers, the port
        chosen for port 0, plus "#lane=<port>" (its control lane) or
        "#curve=<key>" ('#' is never in a host)."""
        self.bind_port = int(endpoint.partition("#")[0].rpartition(":")[2])
        self.endpoint = endpoint

    def initialize(self) -> None:
        """Nothing to set up: libkvcr binds the endpoint when KVCR starts."""

    def send(self, endpoint: str, message: bytes) -> bool:
        return False  # libkvcr sends control messages itself

    def recv(self) -> list:
        return []

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return (f"ZmqPeerControlChannel(bind={self.bind_host}:{self.bind_port}, "
                f"endpoint={self.endpoint!r})")
