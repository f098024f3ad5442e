"""A second SGLang process with its own KVCR, for the hinted pulls of
test_sglang_hicache.py: it stores pages and serves them to peers until told
to stop.

    python sglang_peer.py '<options as JSON>'

Options: kind, layout (the host pool), n (pages), seed, tp_rank, tp_size,
control_port (base; 0: any free port), via ("factory": the backend SGLang's
factory builds, pages under page_key(i); "controller": SGLang's
HiCacheController backs up the pages of token_ids(seed, n) under SGLang's own
keys), model_dir (for "controller").

Page i holds page_data(seed * 1000 + i, page bytes). Once stored, the host
pool is zeroed (only KVCR holds the pages) and one JSON line is printed:
{"endpoint", "keys", "stored"}. Then each line read is a command: "stop"
prints {"stats"} (the backend's counters and its warnings) and exits."""
import json
import logging
import sys

import sglang_helpers as h


class Warnings(logging.Handler):
    """The backend's warnings, reported when the peer stops."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def main() -> int:
    opts = json.loads(sys.argv[1])
    warnings = Warnings()
    logging.getLogger("kvcr.sglang").addHandler(warnings)
    kind, layout, n, seed = opts["kind"], opts["layout"], opts["n"], opts["seed"]
    extra = {"control_port": opts.get("control_port", 0)}
    if opts.get("via") == "controller":
        ctrl = h.controller(kind, layout, opts["model_dir"], **extra)
        backend, pool = ctrl.storage_backend, ctrl.mem_pool_host
        tokens = h.token_ids(seed, n)
        keys = h.storage_keys(tokens)
        where = pool.alloc(n * h.PAGE)
        for i in range(n):
            h.fill_page(pool, int(where[i * h.PAGE]) // h.PAGE, seed * 1000 + i)
        stored = h.backup(ctrl, where, tokens) // h.PAGE
    else:
        ctrl = None
        pool = h.host_pool(kind, layout)
        backend = h.factory_backend(pool, kind, layout, tp_rank=opts.get("tp_rank", 0),
                                    tp_size=opts.get("tp_size", 1), **extra)
        keys = [h.page_key(i) for i in range(n)]
        for i in range(n):
            h.fill_page(pool, i, seed * 1000 + i)
        stored = backend.batch_set_v1(keys, h.indices(pool, range(n))).count(True)
    h.zero_pool(pool)
    print(json.dumps({"endpoint": backend.control_endpoint, "keys": keys, "stored": stored}),
          flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            print(json.dumps({"stats": dict(backend.stats(), warnings=warnings.messages)}),
                  flush=True)
            break
    if ctrl is not None:
        ctrl.detach_storage_backend()
    else:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
