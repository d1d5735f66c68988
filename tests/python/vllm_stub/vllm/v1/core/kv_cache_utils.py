"""Stub of vllm/v1/core/kv_cache_utils.py (vLLM main): block hashes, KVCacheBlock,
resolve_kv_cache_block_sizes.

h_i = H((parent or NONE_HASH, tuple(tokens_i), extra_keys_i)); NONE_HASH = H(seed) with
seed = $PYTHONHASHSEED, else (main) the fixed "vllm-none-hash" for the cryptographic
sha256 / sha256_cbor and 32 random bytes (hex) for xxhash / xxhash_cbor. Releases before
that change used random bytes for every algorithm. Extra keys: (lora_name,) then
cache_salt on block 0; multimodal and prompt-embeds keys are not modelled
(NotImplementedError)."""

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from vllm.utils.hashing import xxhash, xxhash_cbor

logger = logging.getLogger(__name__)

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)

NONE_HASH: BlockHash


def maybe_convert_block_hash(hash_bytes: BlockHash):
    """Hashes as KV events publish them: bytes, or the low 64 bits of the big-endian
    integer with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (vllm.envs; its default is not
    modelled, the stub reads the variable, default off)."""
    if os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0") in ("0", "", "false"):
        return hash_bytes
    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    return BlockHash(key[:-4])


def get_group_id(key: BlockHashWithGroupId) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_NON_CRYPTO_HASH_FUNCTIONS = frozenset({xxhash, xxhash_cbor})
_NONE_HASH_SEED: str | None = None


def resolve_none_hash_seed(hash_fn: Callable[[Any], bytes]) -> str:
    hash_seed = os.getenv("PYTHONHASHSEED")
    if hash_seed is not None:
        return hash_seed
    if hash_fn in _NON_CRYPTO_HASH_FUNCTIONS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def init_none_hash(hash_fn: Callable[[Any], bytes]):
    global NONE_HASH, _NONE_HASH_SEED
    _NONE_HASH_SEED = resolve_none_hash_seed(hash_fn)
    if hash_fn in _NON_CRYPTO_HASH_FUNCTIONS and os.getenv("PYTHONHASHSEED") is None:
        logger.warning("Using a random per-process NONE_HASH seed because %s is not "
                       "collision resistant.", hash_fn.__name__)
    NONE_HASH = BlockHash(hash_fn(_NONE_HASH_SEED))


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    _block_hash: BlockHashWithGroupId | None = None
    # prefix tokens covered by _block_hash (partial entries may end inside a block)
    _block_hash_num_tokens: int | None = None
    prev_free_block: "KVCacheBlock | None" = None
    next_free_block: "KVCacheBlock | None" = None
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._block_hash_num_tokens

    def set_block_hash(self, block_hash: BlockHashWithGroupId,
                       num_tokens: int | None = None) -> None:
        assert self.block_hash is None and self._block_hash_num_tokens is None, (
            "The block already has a hash. This should not happen.")
        self._block_hash = block_hash
        self._block_hash_num_tokens = num_tokens

    def reset_hash(self):
        self._block_hash = None
        self._block_hash_num_tokens = None


def hash_block_tokens(hash_function: Callable[[Any], bytes],
                      parent_block_hash: BlockHash | None,
                      curr_block_token_ids: Sequence[int],
                      extra_keys: tuple[Any, ...] | None = None) -> BlockHash:
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    curr_block_token_ids_tuple = tuple(curr_block_token_ids)
    return BlockHash(hash_function((parent_block_hash, curr_block_token_ids_tuple, extra_keys)))


def generate_block_hash_extra_keys(request, start_token_idx: int, end_token_idx: int,
                                   start_mm_idx: int) -> tuple[tuple[Any, ...] | None, int]:
    if getattr(request, "mm_features", None):
        raise NotImplementedError("stub: multimodal extra keys are not modelled")
    if getattr(request, "prompt_embeds", None) is not None:
        raise NotImplementedError("stub: prompt-embeds extra keys are not modelled")
    keys: list[Any] = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys.append(lora.lora_name)
    if start_token_idx == 0 and getattr(request, "cache_salt", None):
        keys.append(request.cache_salt)
    return (tuple(keys) if keys else None), start_mm_idx


def resolve_kv_cache_block_sizes(kv_cache_config, vllm_config) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size). One group: both are
    ``cache_config.block_size * dcp`` (PCP does not enter; releases before this function
    existed hashed every ``block_size * dcp * pcp`` tokens). Several groups (hybrid
    models): LCM / GCD of the group block sizes (DCP scaling and the prefix_match_unit
    override are not modelled)."""
    import math

    cache_config = vllm_config.cache_config
    dcp = vllm_config.parallel_config.decode_context_parallel_size
    groups = kv_cache_config.kv_cache_groups
    if len(groups) <= 1:
        bs = cache_config.block_size * dcp
        return bs, bs
    sizes = [g.kv_cache_spec.block_size for g in groups]
    return math.lcm(*sizes), math.gcd(*sizes)


def get_request_block_hasher(hash_block_size: int, caching_hash_fn: Callable[[Any], bytes]
                             ) -> Callable[[Any], list[BlockHash]]:
    def request_block_hasher(request) -> list[BlockHash]:
        start_token_idx = len(request.block_hashes) * hash_block_size
        num_tokens = request.num_tokens
        if start_token_idx + hash_block_size > num_tokens:
            return []
        curr_mm_idx = 0 if start_token_idx == 0 else -1
        prev = request.block_hashes[-1] if request.block_hashes else None
        new_block_hashes: list[BlockHash] = []
        while True:
            end_token_idx = start_token_idx + hash_block_size
            if end_token_idx > num_tokens:
                break
            extra_keys, curr_mm_idx = generate_block_hash_extra_keys(
                request, start_token_idx, end_token_idx, curr_mm_idx)
            block_tokens = request.all_token_ids[start_token_idx:end_token_idx]
            h = hash_block_tokens(caching_hash_fn, prev, block_tokens, extra_keys)
            new_block_hashes.append(h)
            start_token_idx += hash_block_size
            prev = h
        return new_block_hashes

    return request_block_hasher
