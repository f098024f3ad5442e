"""KVCRLimits from Python: libkvcr's defaults, ranges refused with libkvcr's
message, a hint over its size or count refused, operations refused while
too many completions wait for poll_completed (none lost), and the refusals
counted in telemetry. The peer limits under load are tested in C
(tests/integration/test-remote-source-load.c)."""
import dataclasses

import pytest

import kvcr
from kvcr.testing import stored_hint


def envelope(hashes):
    return {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": "tcp://127.0.0.1:5555",
                     "block_hashes": list(hashes)}}]}


def test_defaults_are_libkvcr_s():
    lim = kvcr.KVCRLimits()
    assert lim.max_source_writes_per_peer == 64
    assert lim.max_source_writes == 1024
    assert lim.max_unpolled_operations == 65536
    assert lim.max_peers == 1024
    assert lim.peer_idle_ms == 300000
    assert kvcr.KVCRConfig(nixl_agent_name="a", pool_layouts=[("", 4096)]).limits == lim


@pytest.mark.parametrize("field,value,message", [
    ("max_hint_bytes", 63, "limits.max_hint_bytes must be between 64 and 16777216 (got 63)"),
    ("max_unpolled_operations", 0, "limits.max_unpolled_operations must be between 1"),
    ("max_source_writes_per_peer", 2000, "limits.max_source_writes_per_peer must be between 1 "
                                         "and limits.max_source_writes (1024) (got 2000)"),
    ("max_peers", 0, "config.max_peers must be between 1 and 65536 (got 0)"),
    ("peer_idle_ms", 99, "config.peer_idle_ms must be between 100 and 86400000 (got 99)"),
])
def test_out_of_range_is_refused_with_libkvcr_s_message(rig_factory, field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rig_factory(limits=dataclasses.replace(kvcr.KVCRLimits(), **{field: value}))


def test_limits_must_be_a_record_of_u32(rig_factory):
    with pytest.raises(TypeError, match="limits must be a KVCRLimits"):
        rig_factory(limits=(1, 2))
    with pytest.raises(ValueError, match="limits.max_hint_bytes must be between 0 and 4294967295"):
        rig_factory(limits=dataclasses.replace(kvcr.KVCRLimits(), max_hint_bytes=2**32))


def test_hints_over_their_limits_are_refused(rig_factory):
    r = rig_factory(telemetry=True,
                    limits=kvcr.KVCRLimits(max_hint_bytes=400, max_hinted_requests=1))
    r.kv.submit_hint(envelope([1, 2]), request_id="a")
    with pytest.raises(RuntimeError, match=r"over limits.max_hint_bytes \(400\)"):
        r.kv.submit_hint(envelope(range(100)), request_id="b")
    with pytest.raises(RuntimeError, match=r"limits.max_hinted_requests \(1\)"):
        r.kv.submit_hint(envelope([3]), request_id="b")
    assert stored_hint(r.kv, "b") is None
    r.kv.submit_hint(envelope([3]), request_id="a")  # replacing a kept one is fine
    text = r.kv.prometheus_text()
    assert 'kvcr_limit_refusals_total{limit="hint_bytes"} 1\n' in text
    assert 'kvcr_limit_refusals_total{limit="hinted_requests"} 1\n' in text


def test_operations_wait_for_poll_and_none_is_lost(rig_factory):
    r = rig_factory(limits=kvcr.KVCRLimits(max_unpolled_operations=2))
    a = r.kv.deliver({b"missing-1": r.ref(1)})  # misses complete at once
    b = r.kv.deliver({b"missing-2": r.ref(2)})
    with pytest.raises(RuntimeError, match=r"limits.max_unpolled_operations \(2\) reached"):
        r.kv.deliver({b"missing-3": r.ref(3)})
    done = dict(r.kv.poll_completed())
    assert set(done) == {a, b}
    assert all(not e.success and e.reason == "NOT_FOUND" for res in done.values()
               for e in res.values())
    c = r.kv.deliver({b"missing-3": r.ref(3)})
    assert [h for h, _ in r.kv.poll_completed()] == [c]
