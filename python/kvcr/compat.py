"""Every name this package keeps only because callers written for another
API use it: what each one means here, and the shapes that need converting.

Two sources of such names. The reference KVCR (Python on NIXL), whose API
the vLLM adapter (kvcr.integrations.vllm) and vLLM's own adapters were
written against, names options after its transfer library; KVCR moves
blocks with UCX and its own control lanes, so those names are accepted and
mean what INHERITED says. And the first KVCR API, which vLLM 0.30 and 0.31
still call: the engine's memory is one `FrameworkDramInput(address,
length)` and every block reference is a `MemDescriptor` (an absolute
address and a size). This build registers regions (RegionDescriptor) and
references their elements (MemoryRef); here the old shapes become the new
ones, exactly and with clear refusals:

* FrameworkDramInput becomes one region of `length // block_size` elements
  of the single pool's block size, labelled with the pool's name. It needs
  exactly one pool layout and a length that is a whole number of blocks.
* A MemDescriptor becomes the MemoryRef of the element it covers: same
  agent name, DRAM, inside the region, on an element boundary, one block
  long. Anything else is refused (ValueError naming the rule) before any
  copy starts: an address that is not a block of the region would be a
  silent wrong byte, never a guess.

vLLM 0.32 and later use RegionDescriptor and MemoryRef themselves."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .config import _U64_MAX, FrameworkDramInput, G3Options, KVCRConfig, _c_uint
from .types import MemDescriptor, MemoryRef, RegionDescriptor

RELEASES_WITH_REGIONS = "vLLM 0.32 or later"

# (record, field): what KVCR does with a name it inherited.
INHERITED = {
    ("KVCRConfig", "nixl_agent_name"): "the agent name: peers and MemoryRefs name this KVCR by it",
    ("KVCRConfig", "nixl_listen_port"): "checked (1..65535) and unused: peers reach KVCR on its "
                                        "control endpoint (framework_control)",
    ("LocalDramOptions", "backend"): "any non-empty name: KVCR copies DRAM with its own threads",
    ("RemoteFWDramOptions", "backend"): "any non-empty name while the peer tier is off; with it "
                                        "on, \"UCX\" (the only transport)",
    ("G3Options", "backend"): "any non-empty name: KVCR reads and writes G3 with io_uring",
    ("G3Options", "backend_options"): "checked (str to str) and unused",
    ("KVCRBackendConfigs", "framework_dram"): "the first API's memory: one region "
                                              "(framework_region below)",
    ("MemoryRef", "end_point_name"): "the agent name of the memory's owner",
}


def check_inherited(config: KVCRConfig, g3: Any) -> None:
    """The rules of the inherited fields libkvcr has no field for; raises
    before anything starts."""
    port = config.nixl_listen_port
    if port is not None and (type(port) is not int or not 1 <= port <= 65535):
        raise ValueError("nixl_listen_port must be between 1 and 65535")
    if not isinstance(g3, G3Options):
        return  # none, or refused as the wrong type with the G3 arguments
    opts = g3.backend_options  # the backend name is a C string: config.g3_args
    if not isinstance(opts, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in opts.items()):
        raise TypeError("G3 backend_options must map str to str")


@dataclass(frozen=True)
class FrameworkRegion:
    """The one region a FrameworkDramInput registered, for converting
    MemDescriptors against it. Immutable after KVCR(...) validated it; read
    from any thread."""

    agent: str
    pool: str
    base: int
    block_size: int
    count: int

    def ref(self, d: MemDescriptor) -> MemoryRef:
        if not isinstance(d, MemDescriptor):
            raise TypeError(f"a block reference must be a MemDescriptor, not {type(d).__name__}")
        offset = d.addr - self.base
        if d.end_point_name != self.agent:
            raise ValueError(f"MemDescriptor end_point_name {d.end_point_name!r} is not this "
                             f"KVCR's agent {self.agent!r}")
        if d.mem_type != "DRAM":
            raise ValueError(f"MemDescriptor mem_type {d.mem_type!r}: framework_dram is DRAM")
        if d.size != self.block_size:
            raise ValueError(f"MemDescriptor size {d.size} is not the block size "
                             f"{self.block_size}")
        if offset < 0 or offset % self.block_size or offset // self.block_size >= self.count:
            raise ValueError(f"MemDescriptor address {d.addr:#x} is not a block of "
                             f"framework_dram [{self.base:#x}, "
                             f"{self.base + self.count * self.block_size:#x})")
        return MemoryRef(end_point_name=self.agent, label=self.pool,
                         element_index=offset // self.block_size)

    def refs(self, refs) -> list:
        """A key's reference list: MemDescriptors converted, MemoryRefs kept."""
        if not isinstance(refs, list):
            raise TypeError("each block must map to a list of MemDescriptor or MemoryRef")
        return [r if isinstance(r, MemoryRef) else self.ref(r) for r in refs]

    def blocks(self, blocks: Mapping) -> dict:
        """{key: [MemDescriptor | MemoryRef]} as {key: [MemoryRef]}; raises
        before anything is started."""
        if not isinstance(blocks, Mapping):
            raise TypeError("blocks must be a Mapping of key to a list of references")
        return {key: self.refs(refs) for key, refs in blocks.items()}


def framework_region(dram, agent: str, pool_layouts: list) -> Optional[FrameworkRegion]:
    """The region a KVCRBackendConfigs.framework_dram stands for, or None
    without one. Checked by KVCR(...) before anything starts."""
    if dram is None:
        return None
    if not isinstance(dram, FrameworkDramInput):
        raise TypeError("framework_dram must be a FrameworkDramInput or None")
    if len(pool_layouts) != 1:
        raise ValueError("framework_dram (one address range) needs exactly one pool layout; "
                         f"with several pools register framework_regions "
                         f"({RELEASES_WITH_REGIONS} do)")
    pool, block_size = pool_layouts[0]
    base = _c_uint("framework_dram address", dram.address, _U64_MAX)
    length = _c_uint("framework_dram length", dram.length, _U64_MAX)
    if base == 0 or length == 0 or length % block_size:
        raise ValueError(f"framework_dram must be a non-empty range at a non-zero address "
                         f"whose length is a multiple of the block size {block_size} "
                         f"(got address {base:#x}, length {length})")
    return FrameworkRegion(agent, pool, base, block_size, length // block_size)


def region_of(region: FrameworkRegion) -> RegionDescriptor:
    return RegionDescriptor(addr=region.base, size=region.block_size, count=region.count,
                            label=region.pool)
