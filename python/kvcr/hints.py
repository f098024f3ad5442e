"""The router's kv_hint envelope (protocol 0.1, action kv.fetch 1.0), and
an operation's own hints (deposit, fetch).

libkvcr validates the envelope (as JSON) and keeps the request-scoped hint
state; its message is the ValueError's ("invalid router hint", "only copy
mode is currently supported", ...). Python only refuses what JSON would blur
or cannot carry — a tuple (JSON would make it an array), NaN or infinity,
objects json cannot encode — rather than convert it silently. Version
mismatches only warn; libkvcr logs those, once per process."""
from __future__ import annotations

import json
from collections.abc import Mapping

ROUTER_HINT_KEY = "kv_hint"
ROUTER_HINT_CAPABILITIES = frozenset({"router_hint"})

INVALID = "invalid router hint"  # libkvcr's message for a malformed envelope


def _plain(obj):
    """Mappings that are not dicts become dicts, for json.dumps; a tuple is
    refused (a list is the envelope's only array)."""
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, tuple):
        raise ValueError(INVALID)
    return obj


def encode_hints(hints) -> "bytes | None":
    """An operation's own hints (deposit, fetch) as the JSON text libkvcr
    reads, or None. A Mapping, else TypeError; what JSON cannot carry
    exactly (a tuple, NaN, other objects) raises ValueError."""
    if hints is None:
        return None
    if not isinstance(hints, Mapping):
        raise TypeError(f"hints must be a Mapping or None, not {type(hints).__name__}")
    try:
        return json.dumps(_plain(hints), allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"hints must be JSON-encodable: {exc}") from None


def encode_router_hint(hints) -> bytes:
    """The envelope as the JSON text libkvcr reads."""
    try:
        return json.dumps(_plain(hints), allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        raise ValueError(INVALID) from None
