"""KV cache events for KV-aware routers (no vLLM import; the facade converts).

vLLM publishes, with its own GPU-cache events, whatever the scheduler connector's
``take_events()`` returns (``BlockStored`` / ``BlockRemoved``). PegaFlow's blocks live in
the server on this node, so the connector announces, with medium "CPU":

* stored: a block every worker of the instance saved (each worker reports the hashes of
  its successful Saves through ``get_kv_connector_kv_cache_events``; vLLM hands the
  workers' containers to the scheduler's ``update_connector_output``; a hash is stored
  once ``world_size`` distinct workers reported it - TP ranks that skip the copy (MLA
  replicas) report what their rank 0 saves, so rank 0 decides);
* stored: blocks a query hit that were not announced yet (saved by another vLLM on this
  node, or fetched from a peer over P2P / from SSD into this node's server);
* removed: announced blocks a later query no longer finds (evicted, or the server
  restarted): the server matches prefixes, so every announced block after the first miss
  of a query is unreachable and reported removed.

Records here are plain tuples: ("stored", hash, parent_hash | None, token_ids,
block_size, lora_id, lora_name) and ("removed", hash).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from typing import Any, Iterable, Sequence

MAX_TRACKED = 1 << 18  # hashes remembered per kind (announced, planned, partly reported)


class _Lru(OrderedDict):
    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def put(self, k, v) -> None:
        self[k] = v
        self.move_to_end(k)
        while len(self) > self.cap:
            self.popitem(last=False)


class WorkerEventLog:
    """Worker side: the hashes this worker's Saves stored, taken once per step."""

    def __init__(self) -> None:
        self.key = uuid.uuid4().hex[:12]  # distinct per worker process
        self._lock = threading.Lock()
        self._records: list[tuple[str, bytes]] = []

    def saved(self, hashes: Iterable[bytes]) -> None:
        with self._lock:
            self._records.extend((self.key, bytes(h)) for h in hashes)

    def take(self) -> list[tuple[str, bytes]]:
        with self._lock:
            out, self._records = self._records, []
        return out


class EventTracker:
    """Scheduler side: turns worker reports, hits and misses into router events."""

    def __init__(self, world_size: int, cap: int = MAX_TRACKED):
        self.world_size = max(1, int(world_size))
        self._planned: _Lru = _Lru(cap)  # hash -> (parent, tokens, lora_id, lora_name, bs)
        self._reports: _Lru = _Lru(cap)  # hash -> set of worker keys
        self._announced: _Lru = _Lru(cap)  # hash -> True
        self._queue: list[tuple] = []

    # what the scheduler knows about a block
    @staticmethod
    def describe(request: Any, index: int, block_size: int) -> tuple:
        hashes = request.block_hashes
        parent = bytes(hashes[index - 1]) if index > 0 else None
        tokens = list(request.all_token_ids[index * block_size:(index + 1) * block_size])
        lora = getattr(request, "lora_request", None)
        lora_id = getattr(lora, "lora_int_id", None) if lora is not None else None
        lora_name = getattr(lora, "lora_name", None) if lora is not None else None
        return parent, tokens, lora_id, lora_name, block_size

    def planned(self, h: bytes, meta: tuple) -> None:
        if h not in self._announced:
            self._planned.put(h, meta)

    def reports(self, records: Sequence[tuple[str, bytes]]) -> None:
        for key, h in records:
            h = bytes(h)
            if h in self._announced:
                continue
            got = self._reports.get(h) or set()
            got.add(key)
            if len(got) >= self.world_size:
                self._reports.pop(h, None)
                meta = self._planned.pop(h, None)
                if meta is not None:
                    self._announce(h, meta)
            else:
                self._reports.put(h, got)

    def hit(self, h: bytes, meta: tuple) -> None:
        if h not in self._announced:
            self._announce(bytes(h), meta)

    def announced(self, h: bytes) -> bool:
        return h in self._announced

    def answered(self, hashes: Sequence[bytes], num_hit: int) -> None:
        """A Ready answer: announced blocks from the first miss on are gone."""
        if not self._announced:  # nothing announced yet: no per-block work on the hot path
            return
        for h in hashes[max(0, num_hit):]:
            h = bytes(h)
            if self._announced.pop(h, None) is not None:
                self._queue.append(("removed", h))

    def _announce(self, h: bytes, meta: tuple) -> None:
        parent, tokens, lora_id, lora_name, bs = meta
        self._announced.put(h, True)
        self._queue.append(("stored", h, parent, tokens, bs, lora_id, lora_name))

    def take(self) -> list[tuple]:
        out, self._queue = self._queue, []
        return out
