"""Stub of vllm/v1/core/kv_cache_utils.py: block hashes and KVCacheBlock.

h_i = H((parent or NONE_HASH, tuple(tokens_i), extra_keys_i)); NONE_HASH = H(seed) with
seed = $PYTHONHASHSEED, else 32 random bytes. Extra keys: (lora_name,) then cache_salt on
block 0; multimodal and prompt-embeds keys are not modelled (NotImplementedError)."""

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from vllm.utils.hashing import sha256_cbor

logger = logging.getLogger(__name__)

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)

NONE_HASH: BlockHash


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    return BlockHash(key[:-4])


def get_group_id(key: BlockHashWithGroupId) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


def init_none_hash(hash_fn: Callable[[Any], bytes]):
    global NONE_HASH
    hash_seed = os.getenv("PYTHONHASHSEED")
    if hash_seed is None and hash_fn is sha256_cbor:
        logger.warning("PYTHONHASHSEED is not set. This will lead to non-reproducible "
                       "block-hashes when using sha256_cbor as the hash function.")
    NONE_HASH = BlockHash(os.urandom(32) if hash_seed is None else hash_fn(hash_seed))


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    _block_hash: BlockHashWithGroupId | None = None
    prev_free_block: "KVCacheBlock | None" = None
    next_free_block: "KVCacheBlock | None" = None
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHashWithGroupId):
        assert self.block_hash is None, "The block already has a hash."
        self._block_hash = block_hash

    def reset_hash(self):
        self._block_hash = None


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


def get_request_block_hasher(block_size: int, caching_hash_fn: Callable[[Any], bytes]
                             ) -> Callable[[Any], list[BlockHash]]:
    def request_block_hasher(request) -> list[BlockHash]:
        start_token_idx = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start_token_idx + block_size > num_tokens:
            return []
        curr_mm_idx = 0
        prev = request.block_hashes[-1] if request.block_hashes else None
        new_block_hashes: list[BlockHash] = []
        while True:
            end_token_idx = start_token_idx + block_size
            if end_token_idx > num_tokens:
                break
            extra_keys, curr_mm_idx = generate_block_hash_extra_keys(
                request, start_token_idx, end_token_idx, curr_mm_idx)
            block_tokens = request.all_token_ids[start_token_idx:end_token_idx]
            h = hash_block_tokens(caching_hash_fn, prev, block_tokens, extra_keys)
            new_block_hashes.append(h)
            start_token_idx += block_size
            prev = h
        return new_block_hashes

    return request_block_hasher
