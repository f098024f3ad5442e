"""libkvcr's options table (kvcr/options.h) and the Python records agree:
every row names a record field whose default is the row's, and a value
just outside a row's range is refused through the binding as libkvcr
refuses it in C (KVCR_EINVAL, naming the option; tests/unit/
test-options-table.c is the C side)."""
import dataclasses
import mmap

import pytest

import kvcr
from kvcr import _native
from kvcr.config import OPTIONS
from conftest import address_of

BLOCK = 4096
RANGED = ("range", "bounds", "positive", "abandon", "per_peer", "dp_rank")
TOP = {"u16": 2**16 - 1, "u32": 2**32 - 1, "u64": 2**64 - 1}


def record_field(row):
    cls, name = row["py"].split(".")
    return getattr(kvcr.config, cls), name


def test_every_row_is_one_record_field_with_the_row_s_default():
    rows = _native.options()
    assert len(rows) == len(OPTIONS) > 30  # paths are unique
    bound = [row for row in rows if row["py"]]
    assert len({row["py"] for row in bound}) == len(bound)
    for row in bound:
        cls, name = record_field(row)
        field = {f.name: f for f in dataclasses.fields(cls)}.get(name)
        assert field is not None, f"{row['path']}: {row['py']} is no field"
        if field.default is not dataclasses.MISSING:
            assert field.default == row["default"], row["path"]
            assert type(field.default) is type(row["default"]), row["path"]
        if row["rule"] in RANGED and row["type"] != "f64":
            assert row["min"] <= row["default"] <= row["max"] <= TOP[row["type"]], row["path"]


def test_every_default_record_passes_libkvcr(tmp_path):
    pool = mmap.mmap(-1, BLOCK * 2)
    try:
        kvcr.KVCR(*parts(pool)).close()
    finally:
        pool.close()


def parts(pool, row=None, value=None, g3_dir=None):
    """A valid configuration; with row, its record field set to value (and
    the record that holds it present)."""
    sets = {}
    if row is not None:
        cls, name = record_field(row)
        sets[cls.__name__] = {name: value}
    limits = kvcr.KVCRLimits(**sets.get("KVCRLimits", {}))
    events = (kvcr.KVEventsOptions(endpoint="inproc://opts", **sets["KVEventsOptions"])
              if "KVEventsOptions" in sets else None)
    config = kvcr.KVCRConfig(nixl_agent_name="opts", pool_layouts=[("", BLOCK)], limits=limits,
                             kv_events=events, **sets.get("KVCRConfig", {}))
    g3 = (kvcr.G3Options(paths=(g3_dir / "g3",), capacity_bytes_per_file=2 * BLOCK,
                         **sets["G3Options"]) if "G3Options" in sets else None)
    backends = kvcr.KVCRBackendConfigs(
        local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)],
                                         **sets.get("LocalDramOptions", {})),
        remote_fw_dram=kvcr.RemoteFWDramOptions(**sets.get("RemoteFWDramOptions", {})), g3=g3)
    return config, kvcr.KVCRBindings(None, None, None), backends


def outside(row):
    """Values just outside the row's range that its C field holds."""
    if row["type"] == "f64":
        return [row["min"] - 0.5, row["max"] + 0.5]
    values = [v for v in (row["min"] - 1, row["max"] + 1) if 0 <= v <= TOP[row["type"]]]
    if row["rule"] == "abandon":
        values.append(2 * OPTIONS["operation_timeout_ms"]["default"] - 1)
    if row["rule"] == "per_peer":
        values.append(OPTIONS["limits.max_source_writes"]["default"] + 1)
    return values


CASES = [(row["path"], v) for row in OPTIONS.values()
         if row["py"] and row["rule"] in RANGED for v in outside(row)]


@pytest.mark.parametrize("path,value", CASES)
def test_a_value_outside_a_row_s_range_is_refused_as_in_c(path, value, tmp_path):
    row = OPTIONS[path]
    name = "abandon_timeout_ms" if row["rule"] == "abandon" else row["label"]
    pool = mmap.mmap(-1, BLOCK * 2)
    try:
        with pytest.raises(kvcr.errors.KVCRInvalidArgument) as info:
            kvcr.KVCR(*parts(pool, row, value, tmp_path))
    finally:
        pool.close()
    assert info.value.code == -1  # KVCR_EINVAL, as the C test gets
    assert name in str(info.value)
    assert not (tmp_path / "g3").exists()  # refused before any file


def test_cases_cover_every_ranged_row():
    assert len({path for path, _ in CASES}) >= 15
    assert len(CASES) >= 25


def native(**changes):
    """kvcr._native.Instance's arguments of a minimal instance, changed."""
    args = dict(agent_name="x", pool_layouts=[dict(name="", block_size=BLOCK)], local_dram=None,
                regions=[], options={}, policy=None, inventory=None, capacity=None, log=None,
                make_entry=lambda *a: None)
    return _native.Instance(**dict(args, **changes))


def test_the_binding_takes_options_and_records_by_name_only():
    with pytest.raises(KeyError, match="no option 'limits.nope'"):
        native(options={"limits.nope": 1})
    with pytest.raises(OverflowError, match="remote.control_port does not hold 65536"):
        native(options={"remote.control_port": 65536})
    # Records are dicts by their C struct's field names, never tuples.
    with pytest.raises(TypeError, match="a pool layout must be a dict by field name, not tuple"):
        native(pool_layouts=[("", BLOCK)])
    with pytest.raises(TypeError, match="block_size"):
        native(pool_layouts=[dict(name="")])
    with pytest.raises(TypeError, match="a tenant must be a dict by field name"):
        native(tenants=[("t", 1, 0)])


def test_a_subclass_of_a_record_is_bound_like_the_record():
    class Limits(kvcr.KVCRLimits):
        __slots__ = ()

    assert kvcr.config._bound(Limits(max_hint_bytes=4096))["limits.max_hint_bytes"] == 4096
    assert kvcr.config._bound(kvcr.KVCRLimits(), max_peers=7)["max_peers"] == 7
