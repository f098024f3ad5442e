"""The router hint shapes SGLang's KVCR backend takes (kvcr.hints
router_hint_envelope, fetch_hashes), which need no SGLang: the kv_hint
envelope as a dict or JSON text, a typed envelope (SGLang's request field
`kv_hints` is a msgspec Struct; a dataclass stands for it here, read the
same way by its fields), one SGLang branch's bare `kvcc_router_hint`
payload, signed and hex hashes, and what is refused.

The backend itself (kvcr.integrations.sglang) imports SGLang: its tests run
against the real sglang package in tests/engines/test_sglang_hicache.py
(scripts/test-sglang.sh), which replaced the stand-ins this file used."""
import json
from dataclasses import dataclass, field

import pytest

from kvcr.hints import fetch_hashes, router_hint_envelope

SRC = "tcp://127.0.0.1:18000"
TOP = 0x9E3779B97F4A7C15  # a hash with the top bit set: SGLang's events send it negative


def envelope(hashes, **payload):
    return {"protocol_version": "0.1", "message_id": "m", "actions": [
        {"action_id": "a", "action_type": "kv.fetch", "action_version": "1.0",
         "payload": dict({"source_control_endpoint": SRC, "block_hashes": hashes}, **payload)}]}


@dataclass
class Action:
    action_id: str
    action_type: str
    action_version: str
    payload: dict = field(default_factory=dict)


@dataclass
class Envelope:
    protocol_version: str
    message_id: str
    actions: list = field(default_factory=list)


def test_every_shape_becomes_the_same_envelope():
    want = envelope([TOP, 7])
    assert router_hint_envelope(envelope([TOP, 7])) == want
    assert router_hint_envelope(envelope([TOP - (1 << 64), 7])) == want        # signed
    assert router_hint_envelope(json.dumps(envelope([TOP, 7]))) == want          # JSON text
    assert router_hint_envelope(json.dumps(envelope([TOP, 7])).encode()) == want
    # Hex text: a 16-digit hash, or a whole 64-digit SGLang page key.
    assert router_hint_envelope(envelope([format(TOP, "016x"),
                                          "0000000000000007" + "ab" * 24])) == want
    typed = Envelope("0.1", "m", [Action("a", "kv.fetch", "1.0",
                                         {"source_control_endpoint": SRC,
                                          "block_hashes": [TOP, 7]})])
    assert router_hint_envelope(typed) == want
    bare = router_hint_envelope({"source_control_endpoint": SRC, "block_hashes": [TOP, 7]})
    assert bare["protocol_version"] == "0.1"
    assert bare["actions"] == [{"action_type": "kv.fetch", "action_version": "1.0",
                                "payload": {"source_control_endpoint": SRC,
                                            "block_hashes": [TOP, 7]}}]
    assert fetch_hashes(bare) == [TOP, 7]


def test_other_actions_pass_untouched_and_hashes_are_gathered_once():
    hint = envelope([1, 2])
    hint["actions"].insert(0, {"action_type": "kv.other", "payload": {"block_hashes": ["x"]}})
    hint["actions"].append({"action_type": "kv.fetch", "action_version": "1.0",
                            "payload": {"block_hashes": [2, 3]}})
    out = router_hint_envelope(hint)
    assert out["actions"][0] == hint["actions"][0]
    assert fetch_hashes(out) == [1, 2, 3]


@pytest.mark.parametrize("bad", [
    "{not json", b"\xff", 7, [], {"protocol_version": "0.1"},
    {"actions": "none"},
    envelope([True]), envelope([1.5]), envelope(["xyz"]), envelope(["abc"]),
    envelope([1 << 64]), envelope([-(1 << 63) - 1]),
    {"actions": [{"action_type": "kv.fetch", "payload": "p"}]},
    {"actions": [{"action_type": "kv.fetch", "payload": {"block_hashes": "1,2"}}]},
])
def test_malformed_hints_are_refused(bad):
    with pytest.raises(ValueError, match="invalid router hint"):
        router_hint_envelope(bad)
