"""What the scheduler side sends the workers each step (plain, picklable data).

vLLM ships the connector metadata from the scheduler process to every worker; the
facade wraps a StepPlan in a KVConnectorMetadata subclass. Block ids are vLLM block ids
of KV cache group 0 (the only group this connector handles).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadIntent:
    """Load ``len(block_ids)`` leased blocks into ``block_ids``.

    ``lease`` is None when the scheduler could not commit the load (lost lease, layout
    drift): the workers then report ``block_ids`` as load errors and the request as
    finished receiving, so vLLM recomputes instead of waiting forever."""

    block_ids: tuple[int, ...]
    lease: bytes | None
    num_tokens: int


@dataclass(frozen=True)
class SaveIntent:
    """Save the full blocks ``block_ids`` under ``block_hashes`` (pairwise)."""

    block_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]


@dataclass
class StepPlan:
    loads: dict[str, LoadIntent] = field(default_factory=dict)
    saves: dict[str, SaveIntent] = field(default_factory=dict)
    preempted: frozenset[str] = frozenset()

    def is_empty(self) -> bool:
        return not (self.loads or self.saves or self.preempted)


def plan_of(metadata) -> StepPlan:
    """The StepPlan inside a facade metadata object (or a StepPlan itself)."""
    if isinstance(metadata, StepPlan):
        return metadata
    plan = getattr(metadata, "plan", None)
    if isinstance(plan, StepPlan):
        return plan
    raise TypeError(f"not PegaFlow connector metadata: {type(metadata).__name__}")
