"""CURVE on the control channel from Python: the RemoteFWDramOptions keys
reach libkvcr (the control endpoint carries the public key, hints naming a
key outside the allow-list are refused, hints naming an allowed one are
kept), and bad keys are refused with libkvcr's reason as ValueError."""
import ctypes
import ctypes.util
import mmap

import pytest

import kvcr
from conftest import address_of

BLOCK = 4096


def keypair():
    """A fresh CURVE key pair (Z85 public, secret) from libzmq itself."""
    zmq = ctypes.CDLL(ctypes.util.find_library("zmq") or "libzmq.so.5")
    pub, sec = ctypes.create_string_buffer(41), ctypes.create_string_buffer(41)
    assert zmq.zmq_curve_keypair(pub, sec) == 0
    return pub.value.decode(), sec.value.decode()


def envelope(source, hashes):
    return {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": source, "block_hashes": list(hashes)}}]}


class IntKeys:
    def decode(self, key):
        return int(bytes(key).decode())


def make(remote, agent="curved"):
    fw = bytearray(4 * BLOCK)
    pool = mmap.mmap(-1, 4 * BLOCK)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name=agent, pool_layouts=[("", BLOCK)]),
        kvcr.KVCRBindings(None, None, None,
                          framework_control=kvcr.ZmqPeerControlChannel("127.0.0.1", 0,
                                                                       "127.0.0.1"),
                          key_adapter=IntKeys()),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4)],
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), 4 * BLOCK)]),
            remote_fw_dram=remote))
    return kv, (fw, pool)


def test_curve_keys_pass_through_to_the_control_channel():
    pub, sec = keypair()
    peer_pub, _ = keypair()
    stranger_pub, _ = keypair()
    kv, mem = make(kvcr.RemoteFWDramOptions(curve_secret_key=sec, curve_public_key=pub,
                                            curve_allowed_keys=(peer_pub,)))
    try:
        endpoint = kv.control_endpoint
        assert endpoint.startswith("tcp://127.0.0.1:")
        assert endpoint.endswith("#curve=" + pub)
        kv.submit_hint(envelope(f"tcp://127.0.0.1:5555#curve={peer_pub}", [1]), "req-ok")
        with pytest.raises(ValueError, match="not in this instance's allow-list"):
            kv.submit_hint(envelope(f"tcp://127.0.0.1:5555#curve={stranger_pub}", [1]), "req-2")
        with pytest.raises(ValueError, match="no CURVE key"):
            kv.submit_hint(envelope("tcp://127.0.0.1:5555", [1]), "req-3")
    finally:
        kv.close()
        mem[1].close()


def test_public_key_may_be_derived():
    pub, sec = keypair()
    peer_pub, _ = keypair()
    kv, mem = make(kvcr.RemoteFWDramOptions(curve_secret_key=sec, curve_allowed_keys=[peer_pub]))
    try:
        assert kv.control_endpoint.endswith("#curve=" + pub)
    finally:
        kv.close()
        mem[1].close()


@pytest.mark.parametrize("which, message", [
    ("bad_secret", "secret_key is not a Z85 key"),
    ("wrong_public", "does not belong to secret_key"),
    ("no_allowed", "allowed_keys must list at least one"),
    ("bad_allowed", r"allowed_keys\[0\] 'short' is not a Z85 key"),
])
def test_bad_curve_keys_are_refused_with_the_reason(which, message):
    pub, sec = keypair()
    other_pub, _ = keypair()
    opts = {
        "bad_secret": dict(curve_secret_key="x" * 39 + "~", curve_allowed_keys=(other_pub,)),
        "wrong_public": dict(curve_secret_key=sec, curve_public_key=other_pub,
                             curve_allowed_keys=(other_pub,)),
        "no_allowed": dict(curve_secret_key=sec, curve_public_key=pub),
        "bad_allowed": dict(curve_secret_key=sec, curve_allowed_keys=("short",)),
    }[which]
    with pytest.raises(ValueError, match=message) as err:
        make(kvcr.RemoteFWDramOptions(**opts))
    assert sec not in str(err.value)  # the secret key is never quoted


def test_curve_option_types_are_checked_in_python():
    with pytest.raises(TypeError, match="curve_allowed_keys"):
        make(kvcr.RemoteFWDramOptions(curve_secret_key="k" * 40, curve_allowed_keys="abc"))
    with pytest.raises(ValueError, match="without secret_key"):  # libkvcr's rule
        make(kvcr.RemoteFWDramOptions(curve_allowed_keys=("k" * 40,)))
