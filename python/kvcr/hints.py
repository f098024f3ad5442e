"""The router's kv_hint envelope (protocol 0.1, action kv.fetch 1.0)."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

logger = logging.getLogger("kvcr")

ROUTER_HINT_KEY = "kv_hint"
ROUTER_HINT_CAPABILITIES = frozenset({"router_hint"})

_warned: set = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        logger.warning(message)


@dataclass(frozen=True)
class ParsedHint:
    source: str
    block_hashes: frozenset


def parse_router_hint(hints) -> ParsedHint:
    """Validates the envelope; every refusal is a ValueError."""
    if not isinstance(hints, Mapping):
        raise ValueError("invalid router hint")
    if hints.get("protocol_version") != "0.1":
        _warn_once("protocol", f"router hint protocol {hints.get('protocol_version')!r} is not 0.1")
    actions = hints.get("actions")
    if not isinstance(actions, list):
        raise ValueError("invalid router hint")
    action = next((a for a in actions
                   if isinstance(a, Mapping) and a.get("action_type") == "kv.fetch"), None)
    if action is not None and action.get("action_version") != "1.0":
        _warn_once("action", f"kv.fetch action version {action.get('action_version')!r} is not 1.0")
    payload = action.get("payload") if action is not None else None
    if not isinstance(payload, Mapping):
        raise ValueError("invalid router hint")
    if "no_retain" in payload:
        raise ValueError("no_retain is not currently supported")
    if payload.get("mode", "copy") != "copy":
        raise ValueError("only copy mode is currently supported")
    source = payload.get("source_control_endpoint")
    if source is None:
        raise ValueError("source-less hints are not currently supported")
    if not isinstance(source, str) or not source:
        raise ValueError("invalid router hint")
    hashes = payload.get("block_hashes")
    if not isinstance(hashes, list):
        raise ValueError("invalid router hint")
    for h in hashes:
        if type(h) is not int or not 0 <= h < 2**64:
            raise ValueError("invalid router hint")
    if not hashes:
        raise ValueError("invalid router hint")
    return ParsedHint(source, frozenset(hashes))


@dataclass
class HintState:
    """Request-scoped hint state (api_spec §6.2)."""

    source: str
    block_hashes: frozenset
    submitted: float
    failed: bool = False
    missing: set = field(default_factory=set)
