"""The router's kv_hint envelope (protocol 0.1, action kv.fetch 1.0).

libkvcr validates the envelope (as JSON) and keeps the request-scoped hint
state. This module checks the Python side first, with the same rules and
messages (api_spec §6.1), so that Python-only shapes (tuples instead of
lists, bools or floats as hashes, objects JSON cannot carry) are refused
rather than silently converted. Version mismatches only warn; libkvcr logs
those, once per process."""
from __future__ import annotations

import json
from collections.abc import Mapping

ROUTER_HINT_KEY = "kv_hint"
ROUTER_HINT_CAPABILITIES = frozenset({"router_hint"})

INVALID = "invalid router hint"


def check_router_hint(hints) -> None:
    """Raises ValueError for an envelope libkvcr would refuse, or one whose
    Python types JSON would blur."""
    if not isinstance(hints, Mapping):
        raise ValueError(INVALID)
    actions = hints.get("actions")
    if not isinstance(actions, list):
        raise ValueError(INVALID)
    action = next((a for a in actions
                   if isinstance(a, Mapping) and a.get("action_type") == "kv.fetch"), None)
    payload = action.get("payload") if action is not None else None
    if not isinstance(payload, Mapping):
        raise ValueError(INVALID)
    if "no_retain" in payload:
        raise ValueError("no_retain is not currently supported")
    if payload.get("mode", "copy") != "copy":
        raise ValueError("only copy mode is currently supported")
    source = payload.get("source_control_endpoint")
    if source is None:
        raise ValueError("source-less hints are not currently supported")
    if not isinstance(source, str) or not source:
        raise ValueError(INVALID)
    hashes = payload.get("block_hashes")
    if not isinstance(hashes, list) or not hashes:
        raise ValueError(INVALID)
    for h in hashes:
        if type(h) is not int or not 0 <= h < 2**64:
            raise ValueError(INVALID)


def _plain(obj):
    """Mappings that are not dicts become dicts, for json.dumps."""
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def encode_router_hint(hints) -> bytes:
    """The envelope as the JSON text libkvcr reads."""
    check_router_hint(hints)
    try:
        return json.dumps(_plain(hints), allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        raise ValueError(INVALID) from None
