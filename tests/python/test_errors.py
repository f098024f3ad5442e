"""libkvcr's failures raise kvcr.errors' classes: the class of the code
(`.code` is the C value), which is also the builtin raised before those
classes existed, so older `except` clauses keep catching them. Each case
makes libkvcr fail for real."""
import dataclasses

import pytest

import kvcr
from kvcr import errors


def test_every_code_has_one_class_and_the_builtin_it_replaced():
    builtin = {-1: ValueError, -4: NotImplementedError}
    for code in range(-1, -12, -1):
        cls = errors.BY_CODE[-code]
        assert issubclass(cls, kvcr.KVCRError) and cls.code == code
        assert issubclass(cls, builtin.get(code, RuntimeError))
    assert issubclass(kvcr.KVCROutOfMemory, MemoryError)
    assert issubclass(kvcr.KVCRSocketError, kvcr.KVCRServiceError)
    assert kvcr.control_channels.KVCRServiceError is kvcr.KVCRServiceError


def test_an_invalid_configuration_raises_invalid_argument(rig_factory):
    with pytest.raises(kvcr.KVCRInvalidArgument) as info:
        rig_factory(limits=dataclasses.replace(kvcr.KVCRLimits(), max_peers=0))
    assert info.value.code == -1 and isinstance(info.value, ValueError)
    assert str(info.value) == "config.max_peers must be between 1 and 65536 (got 0)"


def test_a_limit_raises_limit_error(rig_factory):
    r = rig_factory(limits=kvcr.KVCRLimits(max_unpolled_operations=1))
    r.kv.deliver({b"missing-1": r.ref(1)})
    with pytest.raises(kvcr.KVCRLimitError, match=r"max_unpolled_operations \(1\) reached"):
        r.kv.deliver({b"missing-2": r.ref(2)})
    r.kv.poll_completed()


def test_a_closed_instance_raises_closed_error(rig_factory):
    r = rig_factory()
    r.kv.close()
    with pytest.raises(kvcr.KVCRClosedError, match="the instance is closed") as info:
        r.kv.query([b"k"])
    assert info.value.code == -3 and isinstance(info.value, RuntimeError)


def test_a_bad_hint_raises_invalid_argument(rig_factory):
    r = rig_factory()
    with pytest.raises(kvcr.KVCRInvalidArgument, match="invalid router hint"):
        r.kv.submit_hint({"protocol_version": "0.1", "actions": "no"}, request_id="r")


def test_with_closes_the_instance_also_when_the_block_raises(rig_factory):
    r = rig_factory()
    with pytest.raises(KeyError):
        with r.kv as kv:
            assert kv is r.kv
            raise KeyError("boom")
    with pytest.raises(kvcr.KVCRClosedError):
        r.kv.query([b"k"])


def test_the_package_says_it_is_typed():
    from importlib import resources
    assert resources.files("kvcr").joinpath("py.typed").is_file()
