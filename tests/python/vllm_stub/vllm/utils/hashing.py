"""Stub of vllm/utils/hashing.py: the prefix-caching hash functions.

sha256 (default since v0.10.2): SHA-256 of pickle protocol 5 (HIGHEST_PROTOCOL on
CPython 3.8+). sha256_cbor: SHA-256 of canonical CBOR. xxhash / xxhash_cbor: xxh3_128.
cbor2 and xxhash are optional (Debian python3-cbor2 / python3-xxhash)."""

import hashlib
import pickle
from collections.abc import Callable
from typing import Any


def sha256(input: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(input: Any) -> bytes:
    import cbor2

    return hashlib.sha256(cbor2.dumps(input, canonical=True)).digest()


def xxhash(input: Any) -> bytes:
    import xxhash as _xx

    return _xx.xxh3_128_digest(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(input: Any) -> bytes:
    import cbor2
    import xxhash as _xx

    return _xx.xxh3_128_digest(cbor2.dumps(input, canonical=True))


def get_hash_fn_by_name(hash_fn_name: str) -> Callable[[Any], bytes]:
    if hash_fn_name == "sha256":
        return sha256
    if hash_fn_name == "sha256_cbor":
        return sha256_cbor
    if hash_fn_name == "xxhash":
        return xxhash
    if hash_fn_name == "xxhash_cbor":
        return xxhash_cbor
    raise ValueError(f"Unsupported hash function: {hash_fn_name}")
