"""An engine for test_dynamo_indexer's Guard case, in a process of its own
(the test SIGKILLs it): a KVCR whose KVCR DRAM is a claimed pool group of
a `kvcr service`, with the peer tier (so that the Guard promotes a
backup instance when it dies), publishing KV events on the given
endpoints, that
deposits the blocks of a token sequence with their router metadata (each
committed, so journalled with it), says "ready" on stdout and waits.

    python guard_engine.py SOCKET PUB REPLAY FIRST_TOKEN N_BLOCKS"""
import sys
import time

import kvcr
from conftest import BLOCK, TOKENS, Adapter, address_of, chain

DIGEST = "routers-test"


def main():
    sock, pub, replay, first, n = sys.argv[1:6]
    first, n = int(first), int(n)
    fw = bytearray(BLOCK * n)
    agent = "guard-engine"
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name=agent, pool_layouts=[("", BLOCK)],
                        kv_events=kvcr.KVEventsOptions(endpoint=pub, replay_endpoint=replay,
                                                       topic="kv@guard@model")),
        # The peer tier (a control endpoint on loopback): what the Guard
        # promotes its backup instance for when the engine dies.
        kvcr.KVCRBindings(None, None, None, key_adapter=Adapter(),
                          framework_control=kvcr.ZmqPeerControlChannel("127.0.0.1", 0)),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=n)]),
        kvcr.KVCRGuardConfig(kvcr_service_socket_path=sock, guard_index=0,
                             compatibility_digest=DIGEST))
    blocks = chain(list(range(first, first + n * TOKENS)))
    op = kv.deposit({k: [kvcr.MemoryRef(end_point_name=agent, element_index=i)]
                     for i, (k, _, _) in enumerate(blocks)},
                    router={k: rb for k, _, rb in blocks})
    deadline = time.monotonic() + 20
    done = None
    while done is None and time.monotonic() < deadline:
        for handle, entries in kv.poll_completed():
            if handle == op:
                done = entries
        time.sleep(0.002)
    assert done is not None and all(e.success for e in done.values()), done
    print("ready", flush=True)
    while True:  # publishing from the poll until killed
        kv.poll_completed()
        time.sleep(0.01)


if __name__ == "__main__":
    main()
