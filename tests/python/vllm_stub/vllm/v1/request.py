"""Stub of vllm/v1/request.py: Request with its live block_hashes."""

import enum
from collections.abc import Callable
from functools import partial
from typing import Any


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # everything after PREEMPTED is finished
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int] | None,
                 sampling_params: Any, pooling_params: Any, eos_token_id: int | None,
                 client_index: int = 0, arrival_time: float | None = None,
                 prompt_embeds: Any = None, mm_features: list | None = None,
                 lora_request: Any = None, cache_salt: str | None = None, priority: int = 0,
                 trace_headers: Any = None,
                 block_hasher: Callable[["Request"], list[bytes]] | None = None) -> None:
        self.request_id = request_id
        self.client_index = client_index
        self.priority = priority
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.eos_token_id = eos_token_id
        self.lora_request = lora_request
        self.status = RequestStatus.WAITING
        self.max_tokens = sampling_params.max_tokens if sampling_params is not None else 1
        self.prompt_token_ids = prompt_token_ids
        self.prompt_embeds = prompt_embeds
        self.num_prompt_tokens = len(prompt_token_ids or ())
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt_token_ids or ())
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.mm_features = mm_features or []
        extra = getattr(sampling_params, "extra_args", None) or {}
        self.kv_transfer_params: dict[str, Any] | None = extra.get("kv_transfer_params")
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.block_hashes: list[bytes] = []
        self.get_hash_new_full_blocks: Callable[[], list[bytes]] | None = None
        if block_hasher is not None:
            self.get_hash_new_full_blocks = partial(block_hasher, self)
            self.block_hashes = self.get_hash_new_full_blocks()

    @property
    def output_token_ids(self) -> list[int]:
        return list(self._output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        if self.get_hash_new_full_blocks is not None:
            self.block_hashes.extend(self.get_hash_new_full_blocks())

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
