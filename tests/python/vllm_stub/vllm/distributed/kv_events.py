"""Stub of vllm/distributed/kv_events.py (vLLM main): the KV cache event types a
KV-aware router consumes, the worker-side container (KVConnectorKVEvents) and
KVEventAggregator. Real vLLM makes the events msgspec Structs; without msgspec (Debian
12 has none) the stub uses equivalent keyword dataclasses (same fields and defaults)."""

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


@dataclass(eq=True)
class KVCacheEvent:
    """Base class for all KV cache-related events"""


@dataclass(eq=True)
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    event_version: int = 1
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.parent_block_hash, tuple(self.token_ids),
                     self.block_size, self.lora_id, self.medium, self.group_idx,
                     self.locality, self.ownership, self.event_version))


@dataclass(eq=True)
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium, self.group_idx, self.locality,
                     self.ownership))


@dataclass(eq=True)
class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventAggregator:
    """Counts events across workers; common events are those all workers emitted."""

    def __init__(self, num_workers: int) -> None:
        if num_workers <= 0:
            raise ValueError("num_workers must be greater than zero.")
        self._event_counter: Counter = Counter()
        self._num_workers = num_workers

    def add_events(self, events: list) -> None:
        if not isinstance(events, list):
            raise TypeError("events must be a list of KVCacheEvent.")
        self._event_counter.update(events)

    def get_common_events(self) -> list:
        return [e for e, c in self._event_counter.items() if c == self._num_workers]

    def get_all_events(self) -> list:
        return list(self._event_counter.elements())

    def clear_events(self) -> None:
        self._event_counter.clear()

    def increment_workers(self, count: int = 1) -> None:
        if count <= 0:
            raise ValueError("count must be positive.")
        self._num_workers += count

    def reset_workers(self) -> None:
        self._num_workers = 1

    def get_number_of_workers(self) -> int:
        return self._num_workers


class KVConnectorKVEvents(ABC):
    @abstractmethod
    def add_events(self, events: list) -> None:
        raise NotImplementedError

    @abstractmethod
    def aggregate(self) -> "KVConnectorKVEvents":
        raise NotImplementedError

    @abstractmethod
    def increment_workers(self, count: int = 1) -> None:
        raise NotImplementedError

    @abstractmethod
    def get_all_events(self) -> list:
        raise NotImplementedError

    @abstractmethod
    def get_number_of_workers(self) -> int:
        raise NotImplementedError

    @abstractmethod
    def clear_events(self) -> None:
        raise NotImplementedError

    def merge(self, other: "KVConnectorKVEvents") -> "KVConnectorKVEvents":
        self.add_events(other.get_all_events())
        return self
