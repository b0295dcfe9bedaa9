#!/usr/bin/env python3
"""Writes the seed corpus of the protocol fuzz target (tests/fuzz/protocol_fuzz.cpp).

Each file is one input: byte 0 picks the peer (0 root, 1 alice in the share list, 2 bob in a
shared group, 3 eve a stranger; +4: another client already holds a lease and has the buffer
open), then request frames as a client sends them (docs/protocol.md: the 16-byte header
"CUPL", u16 version 1, u16 kind 1, u32 length, u32 fds 0, then the JSON payload).

One file per operation (hello, then the operation with valid arguments), a few sessions of
several operations, and malformed frames. Usage: make_protocol_corpus.py [OUT_DIR]
(default: tests/fuzz/protocol-corpus next to this script). The output is deterministic.
"""

import json
import os
import struct
import sys

ROOT, ALICE, BOB, EVE, BYSTANDER = 0, 1, 2, 3, 4


def header(length, version=1, kind=1, fds=0, magic=b"CUPL"):
    return magic + struct.pack("<HHII", version, kind, length, fds)


def frame(request, **kw):
    payload = request if isinstance(request, bytes) else json.dumps(request, separators=(",", ":")).encode()
    return header(len(payload), **kw) + payload


def hello(i=1, protocol=1):
    return frame({"id": i, "op": "hello", "protocol": protocol, "client": "fuzz-seed"})


def parts(request, n):
    """`request` in n frames: n - 1 of kind 4 (parts), then the last of kind 1."""
    payload = json.dumps(request, separators=(",", ":")).encode()
    cuts = [len(payload) * i // n for i in range(n + 1)]
    return b"".join(header(cuts[i + 1] - cuts[i], kind=4 if i + 1 < n else 1) + payload[cuts[i]:cuts[i + 1]]
                    for i in range(n))


# A config longer than a frame (its comments): a plan of it is sent in parts.
BIG_CONFIG = "version: 1\n" + "".join(f"# comment {i:05d} " + "." * 60 + "\n" for i in range(1000)) + \
    "pools:\n  - {name: kv, devices: [0, 1], handle_types: [posix_fd], max_size: 1GiB}\n"


def session(peer, *requests, protocol=1):
    out = bytes([peer]) + hello(protocol=protocol)
    for i, r in enumerate(requests, start=2):
        out += r if isinstance(r, bytes) else frame(dict({"id": i}, **r))
    return out


# The fuzz target's config (protocol_fuzz.cpp kConfig), changed: a threshold, a new pool, a
# pool gone, a new buffer.
CHANGED = """version: 1
holder: {socket: /tmp/cupool-fuzz.sock, mode: "0666"}
pools:
  - name: kv
    devices: [0, 1]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: 512MiB
    reserve: 64MiB
    access: [all]
    share: {users: [alice, carol], groups: [gpu], quota_per_client: 128MiB}
  - name: private
    devices: [0]
    handle_types: [posix_fd]
    max_size: 512MiB
  - name: scratch
    devices: [1]
    handle_types: [posix_fd]
    max_size: 256MiB
    share: {groups: [gpu]}
buffers:
  - {name: weights, pool: kv, device: 0, size: 128MiB}
  - {name: table, pool: scratch, device: 1, size: 32MiB}
"""

INVALID = """version: 1
pools:
  - name: kv
    devices: [0, 7]
    max_size: 1GiB
    release_threshold: 2GiB
    share: {users: [alice]}
"""

SEEDS = {
    # one per operation
    "hello": session(EVE),
    "list": session(ALICE, {"op": "list"}),
    "import_pool": session(ALICE, {"op": "import_pool", "pool": "kv", "device": 0}),
    "alloc": session(ALICE, {"op": "alloc", "pool": "kv", "device": 1, "size": 64 << 20, "synchronize": False}),
    "free": session(BOB, {"op": "alloc", "pool": "kv", "size": 1 << 20}, {"op": "free", "lease": 1}),
    "buffer_open": session(BOB, {"op": "buffer_open", "name": "weights"}),
    "buffer_close": session(ALICE, {"op": "buffer_open", "name": "weights"}, {"op": "buffer_close", "name": "weights"}),
    "status": session(EVE, {"op": "status"}),
    "stats": session(ROOT, {"op": "stats", "reset_peaks": True}),
    "trim": session(ROOT, {"op": "trim", "keep": 0, "pool": "kv", "graph": True}),
    "plan": session(EVE, {"op": "plan", "config": CHANGED, "path": "changed.yaml"}),
    "apply": session(ROOT, {"op": "apply", "config": CHANGED, "path": "changed.yaml"}),
    "export": session(EVE, {"op": "export"}),
    "buffer_create": session(ROOT, {"op": "buffer_create", "name": "scratch", "pool": "kv", "device": 1, "size": 16 << 20}),
    "buffer_remove": session(ROOT | BYSTANDER, {"op": "buffer_remove", "name": "weights", "force": True}),
    # protocol 4: docs/naming.md's names (the sessions above speak 1, in the old ones)
    "alloc-v4": session(ALICE, {"op": "alloc", "pool": "kv", "device": 1, "size_bytes": 64 << 20},
                        {"op": "free", "lease": 1}, protocol=4),
    "trim-v4": session(ROOT, {"op": "trim", "keep_bytes": 1 << 20, "pool": "kv"}, protocol=4),
    "buffer-parts-v4": session(
        ROOT,
        {"op": "buffer_create", "name": "parted", "pool": "kv", "size_bytes": 8192, "part_sizes_bytes": [4096, 4096],
         "loading": True, "tensors": [{"name": "a", "dtype": "U8", "shape": [16], "part": 1, "offset_bytes": 0,
                                        "size_bytes": 16}]},
        {"op": "buffer_open", "name": "parted", "part": 1}, {"op": "buffer_ready", "name": "parted"}, protocol=4),
    "old-name-on-v4": session(ALICE, {"op": "alloc", "pool": "kv", "size": 4096}, protocol=4),
    # a held tensor set: created loading with its index, opened, made ready, read by another peer
    "buffer-load": session(
        ROOT,
        {"op": "buffer_create", "name": "llama", "pool": "kv", "size": 4096, "loading": True,
         "tensors": [{"name": "embed.weight", "dtype": "F16", "shape": [8, 16], "offset_bytes": 0, "size_bytes": 256},
                     {"name": "norm", "dtype": "BF16", "shape": [16], "offset_bytes": 256, "size_bytes": 32},
                     {"name": "scale", "dtype": "F32", "shape": [], "offset_bytes": 512, "size_bytes": 4}],
         "metadata": {"format": "pt"}},
        {"op": "buffer_open", "name": "llama"},
        {"op": "buffer_tensors", "name": "llama"},
        {"op": "buffer_close", "name": "llama"},
        {"op": "buffer_ready", "name": "llama"},
        {"op": "buffer_tensors", "name": "llama"},
        {"op": "list"},
    ),
    "buffer-load-bad-index": session(
        ROOT,
        {"op": "buffer_create", "name": "bad", "pool": "kv", "size": 64, "loading": True,
         "tensors": [{"name": "a", "dtype": "F32", "shape": [8], "offset_bytes": 0, "size_bytes": 32},
                     {"name": "b", "dtype": "F32", "shape": [8], "offset_bytes": 16, "size_bytes": 32}]},
        {"op": "buffer_ready", "name": "bad"},
    ),
    # sessions
    "session-user": session(
        ALICE,
        {"op": "import_pool", "pool": "kv"},
        {"op": "alloc", "pool": "kv", "device": 0, "size": 100 << 20},
        {"op": "alloc", "pool": "kv", "device": 0, "size": 200 << 20},  # over the quota
        {"op": "alloc", "pool": "kv", "device": 1, "size": 3, "synchronize": True},
        {"op": "buffer_open", "name": "weights"},
        {"op": "free", "lease": 1},
        {"op": "stats"},
        {"op": "buffer_close", "name": "weights"},
        {"op": "status"},
    ),
    "session-admin": session(
        ROOT | BYSTANDER,
        {"op": "plan", "config": CHANGED},
        {"op": "apply", "config": CHANGED},
        {"op": "apply", "config": CHANGED},
        {"op": "alloc", "pool": "private", "size": 1 << 30},
        {"op": "buffer_create", "name": "b-1", "pool": "scratch", "size": 2 << 20},
        {"op": "buffer_remove", "name": "weights"},
        {"op": "trim", "keep": 1 << 20, "graph": False},
        {"op": "export"},
    ),
    "session-stranger": session(
        EVE,
        {"op": "alloc", "pool": "kv", "size": 1 << 20},
        {"op": "import_pool", "pool": "private"},
        {"op": "buffer_open", "name": "weights"},
        {"op": "apply", "config": CHANGED},
        {"op": "stats", "reset_peaks": True},
        {"op": "plan", "config": INVALID, "path": "invalid.yaml"},
    ),
    "refusals": session(
        BOB,
        {"op": "alloc", "pool": "local", "size": 1},
        {"op": "alloc", "pool": "kv", "device": 5, "size": 1},
        {"op": "alloc", "pool": "kv", "size": 0},
        {"op": "alloc", "pool": "k", "sise": 1},
        {"op": "free", "lease": 99},
        {"op": "buffer_close", "name": "nope"},
        {"op": "allocate"},
        {"id": -1, "op": "list"},
    ),
    # protocol 2: cached blocks (the bystander of +4 keeps a 2 MiB block cached, lease 2, and
    # answers drop notices; the fuzzed client's own requests may wait for drops)
    "cache-reuse": session(
        ALICE,
        {"op": "alloc", "pool": "kv", "device": 0, "size": 64 << 20},
        {"op": "free", "lease": 1, "cache": True, "quiet": True},
        {"op": "reuse", "lease": 1, "quiet": True},
        {"op": "free", "lease": 1, "cache": True},
        {"op": "status"},
        {"op": "free", "lease": 1},
        protocol=2),
    "cache-quota-waits": session(
        ALICE,
        {"op": "alloc", "pool": "kv", "device": 0, "size": 200 << 20},
        {"op": "free", "lease": 1, "cache": True, "quiet": True},
        {"op": "alloc", "pool": "kv", "device": 0, "size": 100 << 20},  # waits: its own block is asked back
        {"op": "list"},  # held until the allocation is answered
        {"op": "dropped", "ask": 1, "leases": [1], "quiet": True},
        {"op": "status"},
        protocol=2),
    "cache-trim-bystander": session(
        ROOT | BYSTANDER,
        {"op": "trim", "keep": 0},  # waits for the bystander's cached block
        {"op": "stats"},
        protocol=2),
    "cache-apply-bystander": session(ROOT | BYSTANDER, {"op": "apply", "config": CHANGED}, protocol=2),
    "cache-pressure": session(
        ROOT | BYSTANDER,
        {"op": "alloc", "pool": "kv", "device": 0, "size": 1000 << 20},
        {"op": "alloc", "pool": "private", "size": 500 << 20},
        {"op": "free", "lease": 3, "cache": True},
        {"op": "alloc", "pool": "private", "size": 100 << 20},
        protocol=2),
    "cache-refusals": session(
        BOB,
        {"op": "alloc", "pool": "kv", "size": 1 << 20},
        {"op": "free", "lease": 1, "cache": True},  # protocol 1: refused
        {"op": "status", "quiet": True},
        {"op": "dropped", "ask": 9, "leases": [1, 2]},
        {"op": "dropped", "ask": 9, "leases": "all"},
        {"op": "reuse", "lease": 2},
    ),
    # malformed frames
    "bad-magic": bytes([ROOT]) + hello()[:16].replace(b"CUPL", b"CUPX") + hello()[16:],
    "bad-version": bytes([ROOT]) + frame({"id": 1, "op": "hello", "protocol": 1}, version=2),
    "bad-kind": bytes([ROOT]) + frame({"id": 1, "op": "hello", "protocol": 1}, kind=2),
    "bad-fds": bytes([ALICE]) + frame({"id": 1, "op": "hello", "protocol": 1}, fds=1),
    "bad-length-short": bytes([ROOT]) + header(1) + b"{",
    "bad-length-long": bytes([ROOT]) + header(65537) + b"{}",
    "bad-json": session(ALICE, frame(b'{"id": 2, "op": "list"')),
    "bad-array": session(ALICE, frame(b'[{"id": 2, "op": "list"}]')),
    "bad-utf8": session(ALICE, frame(b'{"id": 2, "op": "list", "x": "\xc3\x28"}')),
    "bad-nesting": session(ALICE, frame(b'{"id": 2, "op": "list", "x": ' + b"[" * 20 + b"]" * 20 + b"}")),
    "truncated": session(ALICE, frame({"id": 2, "op": "list"})[:-3]),
    "hello-required": bytes([ALICE]) + frame({"id": 1, "op": "list"}),
    "bad-hello": bytes([ALICE]) + frame({"id": 1, "op": "hello", "protocol": 3, "client": "x\u0001"}),
    # requests in parts (frames of kind 4, then the last): joined for admins, refused for others
    "parts-admin": session(ROOT, parts({"id": 2, "op": "plan", "config": BIG_CONFIG}, 2)),
    "parts-stranger": session(EVE, parts({"id": 2, "op": "plan", "config": BIG_CONFIG}, 2)),
    "parts-small": session(ROOT, parts({"id": 2, "op": "status"}, 3), frame({"id": 3, "op": "list"})),
    "parts-cut": session(ROOT, parts({"id": 2, "op": "status"}, 3)[:-20]),
    "parts-then-hello": bytes([ROOT]) + parts({"id": 1, "op": "hello", "protocol": 1}, 2),
    # issue 22: a key twice (refused, not the last one winning), many keys (read in linear time),
    # a lease named twice in `dropped` (refused, not "internal")
    "key-twice": session(ALICE, frame(b'{"id": 2, "op": "list", "op": "status"}'),
                         frame(b'{"id": 3, "op": "alloc", "pool": "kv", "size": 1, "size": 2}')),
    "many-keys": session(ROOT, parts(dict({"id": 2, "op": "status"}, **{f"k{i}": i for i in range(1100)}), 2)),
    "dropped-twice": session(
        ALICE,
        {"op": "alloc", "pool": "kv", "device": 0, "size": 1 << 20},
        {"op": "free", "lease": 1, "cache": True, "quiet": True},
        {"op": "dropped", "ask": 0, "leases": [1, 1]},
        {"op": "dropped", "ask": 0, "leases": [1]},
        protocol=2),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol-corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} inputs to {out}")


if __name__ == "__main__":
    main()
