"""vllm/config/kv_events.py (vLLM main): KV cache event publishing. vLLM publishes the
events of its KV cache manager and of the connector's take_events() only with
``enable_kv_cache_events`` and a publisher other than "null"
(EventPublisherFactory.create in vllm/distributed/kv_events.py)."""

from dataclasses import dataclass
from typing import Literal


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] = None  # type: ignore[assignment]
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
