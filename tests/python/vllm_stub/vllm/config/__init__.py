"""vllm.config: the fields and methods the connector reads, as dataclasses."""

from dataclasses import dataclass, field
from typing import Any

from vllm.config.kv_events import KVEventsConfig
from vllm.config.kv_transfer import KVTransferConfig


@dataclass
class ModelConfig:
    model: str = "facebook/opt-125m"
    dtype: Any = "torch.bfloat16"
    hf_text_config: Any = None
    num_kv_heads: int = 8
    head_size: int = 64
    num_hidden_layers: int = 4

    def get_total_num_kv_heads(self) -> int:
        return self.num_kv_heads

    def get_head_size(self) -> int:
        return self.head_size

    def get_total_num_hidden_layers(self) -> int:
        return self.num_hidden_layers


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"


@dataclass
class ParallelConfig:
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    data_parallel_rank_local: int | None = None
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    world_size: int = field(init=False)

    def __post_init__(self):
        self.world_size = (self.pipeline_parallel_size * self.tensor_parallel_size
                           * self.prefill_context_parallel_size)


@dataclass
class SchedulerConfig:
    disable_hybrid_kv_cache_manager: bool = False
    max_num_batched_tokens: int = 8192


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: KVTransferConfig | None = None
    kv_events_config: KVEventsConfig | None = None
    additional_config: dict | Any = field(default_factory=dict)
    instance_id: str = ""


__all__ = ["CacheConfig", "KVEventsConfig", "KVTransferConfig", "ModelConfig",
           "ParallelConfig", "SchedulerConfig", "VllmConfig"]
