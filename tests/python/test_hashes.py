"""vLLM's block-hash recipe as the stub implements it, against the golden vectors of
shared/reference/vllm-connector.md §4.2 (CPython 3.11, PYTHONHASHSEED=0, block 0 = tokens
0..15, block 1 = 16..31, no extra keys). The connector forwards request.block_hashes as
keys byte for byte, so these are the keys two deployments share."""

from __future__ import annotations

import importlib.util
import pickle

import pytest

from conftest import REAL_VLLM

GOLDEN = {
    "sha256": ("1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
               "6358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec84ae048faaaa6",
               "3c3c50f324aefbdfbb124dfdc541efac3e94e59c40f4be08afe70601eeca92c8"),
    "sha256_cbor": ("4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
                    "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
                    "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"),
    "xxhash": ("6fb31cc38bba6066183f7f2104b9c051", "8ef953407c0da43eacbb3639ed2bff4d",
               "5a51cc5ac3a4b1f7d5efd012fb00201a"),
    "xxhash_cbor": ("1ebe36576dcb573f26b99533a20aaeca", "209f5d549fc07c8e39d823615ede61ce",
                    "03888914ee75b87e89df867a21beb72b"),
}
NEEDS = {"sha256": [], "sha256_cbor": ["cbor2"], "xxhash": ["xxhash"],
         "xxhash_cbor": ["cbor2", "xxhash"]}
DEBIAN = {"cbor2": "python3-cbor2", "xxhash": "python3-xxhash"}


@pytest.fixture
def seeded(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


def _skip_without(algo):
    miss = [m for m in NEEDS[algo] if importlib.util.find_spec(m) is None]
    if miss:
        pytest.skip("SKIP: needs " + ", ".join(f"{m} (Debian {DEBIAN[m]})" for m in miss))


@pytest.mark.parametrize("algo", list(GOLDEN))
def test_golden_vectors(algo, seeded):
    _skip_without(algo)
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    h = get_hash_fn_by_name(algo)
    kcu.init_none_hash(h)
    none, h0, h1 = GOLDEN[algo]
    assert kcu.NONE_HASH.hex() == none
    b0 = kcu.hash_block_tokens(h, None, list(range(16)))
    b1 = kcu.hash_block_tokens(h, b0, list(range(16, 32)))
    assert (b0.hex(), b1.hex()) == (h0, h1)


def test_pickle_input_layout_for_a_c_encoder(seeded):
    """§4.2: pickle 5 of (parent32, 16 small tokens, None) is 85 bytes, framed."""
    data = pickle.dumps((b"\0" * 32, tuple(range(16)), None), protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) == 85
    assert data[:2] == b"\x80\x05" and data[2] == 0x95
    assert int.from_bytes(data[3:11], "little") == len(data) - 11
    assert data[11:13] == b"C\x20" and data[-3:] == b"\x87\x94."


def test_request_block_hashes_follow_the_recipe_and_grow(seeded):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    kcu.init_none_hash(sha256)
    hasher = kcu.get_request_block_hasher(16, sha256)
    req = Request("r", list(range(40)), SamplingParams(max_tokens=30), None,
                  block_hasher=hasher)
    assert [h.hex() for h in req.block_hashes] == list(GOLDEN["sha256"][1:])
    assert len(req.block_hashes) == req.num_tokens // 16
    live = req.block_hashes  # the connector keeps this reference
    for t in range(40, 47):
        req.append_output_token_ids(t)
        assert len(live) == 2
    req.append_output_token_ids(47)  # token 47 completes block 2
    assert len(live) == 3 == req.num_tokens // 16
    assert live[2] == kcu.hash_block_tokens(sha256, live[1], list(range(32, 48)))


def test_extra_keys_lora_and_salt(seeded):
    from types import SimpleNamespace

    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    kcu.init_none_hash(sha256)
    hasher = kcu.get_request_block_hasher(16, sha256)
    plain = Request("a", list(range(32)), SamplingParams(), None, block_hasher=hasher)
    salted = Request("b", list(range(32)), SamplingParams(), None, cache_salt="s",
                     block_hasher=hasher)
    lora = Request("c", list(range(32)), SamplingParams(), None,
                   lora_request=SimpleNamespace(lora_name="L"), block_hasher=hasher)
    assert salted.block_hashes[0] == kcu.hash_block_tokens(sha256, None, range(16), ("s",))
    assert lora.block_hashes[1] == kcu.hash_block_tokens(sha256, lora.block_hashes[0],
                                                         range(16, 32), ("L",))
    assert len({plain.block_hashes[1], salted.block_hashes[1], lora.block_hashes[1]}) == 3


def test_unseeded_none_hash_follows_main(monkeypatch):
    """vLLM main: without PYTHONHASHSEED, sha256 seeds NONE_HASH with the fixed
    "vllm-none-hash" (shareable across launches); xxhash keeps a random seed."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as kcu

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kcu.init_none_hash(sha256)
    a = kcu.NONE_HASH
    kcu.init_none_hash(sha256)
    assert a == kcu.NONE_HASH == sha256("vllm-none-hash") and len(a) == 32
    if importlib.util.find_spec("xxhash") is None:
        return
    from vllm.utils.hashing import xxhash

    kcu.init_none_hash(xxhash)
    b = kcu.NONE_HASH
    kcu.init_none_hash(xxhash)
    assert b != kcu.NONE_HASH


@pytest.mark.skipif(not REAL_VLLM, reason="SKIP: real vLLM not installed; the stub is "
                    "checked against the golden vectors above instead")
def test_real_vllm_matches_golden(seeded):  # pragma: no cover - needs vLLM
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as kcu

    kcu.init_none_hash(sha256)
    b0 = kcu.hash_block_tokens(sha256, None, list(range(16)))
    assert b0.hex() == GOLDEN["sha256"][1]
