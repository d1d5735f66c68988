"""Stub of vllm/v1/request.py (vLLM main): Request with its live block_hashes.

Main dropped the ``eos_token_id`` constructor argument and ``get_hash_new_full_blocks``;
the hasher is kept unbound in ``_block_hasher`` and applied by ``update_block_hashes()``.
``num_publishable_block_hashes`` bounds the hashes a content-addressed connector may
store by (with successor-aware EAGLE hashing the newest hashes are published only after
the draft KV is materialised; vLLM's base class docstrings ask connectors to apply it).
The stub models it as ``len(block_hashes)`` unless ``mark_eagle_hashes_publishable``
limited it (as in vLLM's tests); preemption resets that limit to 0.
"""

import enum
from collections.abc import Callable, Mapping
from typing import Any


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int] | None,
                 sampling_params: Any, pooling_params: Any, client_index: int = 0,
                 arrival_time: float | None = None, prompt_embeds: Any = None,
                 mm_features: list | None = None, lora_request: Any = None,
                 cache_salt: str | None = None, priority: int = 0,
                 trace_headers: Mapping[str, str] | None = None,
                 block_hasher: Callable[["Request"], list[bytes]] | None = None,
                 resumable: bool = False, reasoning_ended: bool | None = None) -> None:
        self.request_id = request_id
        self.client_index = client_index
        self.priority = priority
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.lora_request = lora_request
        self.status = RequestStatus.WAITING
        self.kv_transfer_params: dict[str, Any] | None = None
        if pooling_params is not None:
            self.max_tokens = 1
        elif sampling_params is not None:
            assert sampling_params.max_tokens is not None
            self.max_tokens = sampling_params.max_tokens
            if getattr(sampling_params, "structured_outputs", None) is not None:
                self.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
            if sampling_params.extra_args is not None:
                self.kv_transfer_params = sampling_params.extra_args.get("kv_transfer_params")
        else:
            raise ValueError("sampling_params and pooling_params can't both be unset")
        self.prompt_token_ids = prompt_token_ids
        self.prompt_embeds = prompt_embeds
        self.num_prompt_tokens = len(prompt_token_ids or ())
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt_token_ids or ())
        self.num_output_placeholders = 0
        self.discard_latest_async_tokens = False
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.mm_features = mm_features or []
        self.trace_headers = trace_headers
        self.is_prefill_chunk = False
        self.num_preemptions = 0
        self.num_external_computed_tokens = 0
        self.block_hashes: list[bytes] = []
        self._block_hasher: Callable[["Request"], list[bytes]] | None = block_hasher
        self._publishable_limit: int | None = None
        self.update_block_hashes()
        self.resumable = resumable

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    @property
    def num_publishable_block_hashes(self) -> int:
        if self._publishable_limit is None:
            return len(self.block_hashes)
        return min(self._publishable_limit, len(self.block_hashes))

    def mark_eagle_hashes_publishable(self, num_tokens: int, block_size: int) -> None:
        self._publishable_limit = num_tokens // block_size

    @property
    def output_token_ids(self) -> list[int]:
        return list(self._output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # everything after PREEMPTED is finished
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED
