#!/usr/bin/env python3
"""Writes seed inputs whose JSON objects have keys that share one libstdc++ std::hash<std::string>
value (issue 34, hash flooding): a tensor file's header, a holder request and a custody manifest.

libstdc++ hashes a string with a MurmurHash64A-like function of a fixed seed (libsupc++'s
hash_bytes.cc): each 8-byte block is mixed by an invertible function and XORed into the state, so
the second block of a 16-byte key can bring any first block to one chosen state. A reader that
refused duplicate keys with a hashed set spent quadratic time on such keys; the fuzz targets keep
them in their corpora so that a reader that does so again is slow on its seeds. The unit test
tests/unit/base/json_reader_test.cpp builds the same keys and checks them against std::hash.

Usage: colliding_keys.py [COUNT]   (default 200 keys per input: enough to keep the shape in the corpora, small enough for the
    replay under the sanitizers; the unit test times 20,000; deterministic output)
"""
import json
import os
import struct
import sys

MASK = (1 << 64) - 1
MUL = ((0xc6a4a793 << 32) + 0x5bd1e995) & MASK
SEED = 0xc70f6907
INV = pow(MUL, -1, 1 << 64)


def shift_mix(v):
    return v ^ (v >> 47)


def mix(block):
    return (shift_mix((block * MUL) & MASK) * MUL) & MASK


def unmix(data):
    return (shift_mix((data * INV) & MASK) * INV) & MASK


def std_hash(key):
    """libstdc++'s std::hash of `key` (bytes), for the check below."""
    h = SEED ^ ((len(key) * MUL) & MASK)
    aligned = len(key) & ~7
    for at in range(0, aligned, 8):
        h = ((h ^ mix(int.from_bytes(key[at:at + 8], "little"))) * MUL) & MASK
    if len(key) & 7:
        h = ((h ^ int.from_bytes(key[aligned:], "little")) * MUL) & MASK
    h = (shift_mix(h) * MUL) & MASK
    return shift_mix(h)


def keys(count):
    start = SEED ^ ((16 * MUL) & MASK)
    target = 0x1234567890abcdef
    out, n = [], 0
    while len(out) < count:
        first = b"%08x" % n
        n += 1
        state = ((start ^ mix(int.from_bytes(first, "little"))) * MUL) & MASK
        second = unmix(state ^ target).to_bytes(8, "little")
        if all(0x20 <= c < 0x7f and c not in b'"\\' for c in second):
            out.append((first + second).decode())
    assert len({std_hash(k.encode()) for k in out}) == 1
    return out


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    here = os.path.dirname(os.path.abspath(__file__))
    names = keys(count)
    # A tensor file: every tensor an empty U8 one, so the header is all that is read.
    header = json.dumps({k: {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for k in names},
                        separators=(",", ":")).encode()
    with open(os.path.join(here, "safetensors-corpus", "colliding-names.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
    # A holder request (protocol-corpus: byte 0 picks the peer, root; then hello and the request).
    sys.path.insert(0, here)
    import make_protocol_corpus as P  # noqa: E402 - the corpus's own framing
    request = {"id": 2, "op": "list"}
    request.update({k: 1 for k in names})
    with open(os.path.join(here, "protocol-corpus", "colliding-keys.bin"), "wb") as f:
        f.write(bytes([P.ROOT]) + P.hello() + P.frame(request))
    # A custody manifest whose tensor index's metadata has the keys.
    manifest = {"manifest": 1, "sequence": 7, "holder": {"uid": 0, "pid": 4242}, "written": "2025-01-31T12:00:00Z",
                "backend": "simulated",
                "buffers": [{"name": "w", "pool": "kv", "device": 0, "uuid": "GPU-5e2d1c4a-0000-4000-8000-000000000001",
                             "size": 4096, "parts": [4096], "mapped": [4096], "owner": 0, "origin": "client",
                             "index": {"tensors": [], "metadata": {k: "v" for k in names}}}]}
    with open(os.path.join(here, "manifest-corpus", "colliding-keys.json"), "w") as f:
        f.write(json.dumps(manifest, separators=(",", ":")))


if __name__ == "__main__":
    main()
