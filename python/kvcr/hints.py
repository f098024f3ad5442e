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
    """Mappings that are not dicts become dicts, and so do msgspec Structs
    (vLLM's KvHintsEnvelope, which vLLM 0.34 passes as it is), for
    json.dumps; a tuple is refused (a list is the envelope's only array)."""
    fields = getattr(type(obj), "__struct_fields__", None)
    if isinstance(fields, tuple):
        return {name: _plain(getattr(obj, name)) for name in fields}
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


# ---- router hints as engines carry them ------------------------------------------------

FETCH = "kv.fetch"
U64 = 1 << 64


def _builtin(value):
    """A typed envelope (a msgspec Struct such as SGLang's KvHintsEnvelope,
    or a dataclass) as plain dicts and lists; other values unchanged."""
    fields = getattr(type(value), "__struct_fields__", None)
    if fields is None:
        fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None and not isinstance(value, type):
        return {f: _builtin(getattr(value, f)) for f in fields}
    if isinstance(value, Mapping):
        return {k: _builtin(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_builtin(v) for v in value]
    return value


def _block_hash(value) -> int:
    """A router block hash as KVCR keeps it (unsigned 64-bit): an int
    (SGLang's events send it signed), or hex text of at least 16 digits
    whose first 16 are the hash (a 16-digit hash, or a whole SGLang page
    key)."""
    if isinstance(value, bool):
        raise ValueError(INVALID)
    if isinstance(value, int):
        if not -(1 << 63) <= value < U64:
            raise ValueError(INVALID)
        return value % U64
    if isinstance(value, str) and len(value) >= 16:
        try:
            return int(value[:16], 16)
        except ValueError:
            raise ValueError(INVALID) from None
    raise ValueError(INVALID)


def router_hint_envelope(value) -> dict:
    """The kv_hint envelope (protocol 0.1) of a router hint in any shape an
    engine carries it: the envelope itself as a dict, JSON text or a typed
    struct (SGLang's request field `kv_hints` is a msgspec KvHintsEnvelope),
    or a bare kv.fetch payload {source_control_endpoint, block_hashes} (what
    one SGLang branch passes as `kvcc_router_hint`). Every kv.fetch action's
    block hashes become unsigned 64-bit integers (signed ints and hex text
    are accepted); other actions pass untouched. Anything else raises
    ValueError("invalid router hint")."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(INVALID) from None
    value = _builtin(value)
    if not isinstance(value, dict):
        raise ValueError(INVALID)
    if "actions" not in value:
        if "block_hashes" not in value:
            raise ValueError(INVALID)
        value = {"protocol_version": "0.1", "actions": [
            {"action_type": FETCH, "action_version": "1.0", "payload": value}]}
    if not isinstance(value["actions"], list):
        raise ValueError(INVALID)
    actions = []
    for action in value["actions"]:
        if isinstance(action, dict) and action.get("action_type") == FETCH:
            payload = action.get("payload")
            if not isinstance(payload, dict) or not isinstance(payload.get("block_hashes"),
                                                                list):
                raise ValueError(INVALID)
            payload = dict(payload, block_hashes=[_block_hash(h)
                                                  for h in payload["block_hashes"]])
            action = dict(action, payload=payload)
        actions.append(action)
    return dict(value, actions=actions)


def fetch_hashes(envelope: Mapping) -> list:
    """The block hashes of an envelope's kv.fetch actions (as
    router_hint_envelope returns it), in order, without repeats."""
    seen = {}
    for action in envelope.get("actions") or []:
        if isinstance(action, Mapping) and action.get("action_type") == FETCH:
            for h in (action.get("payload") or {}).get("block_hashes") or []:
                seen.setdefault(h, None)
    return list(seen)
