"""What the scheduler side sends the workers each step (plain, picklable data).

vLLM ships the connector metadata from the scheduler process to every worker; the
facade wraps a StepPlan in a KVConnectorMetadata subclass. Block ids are vLLM block ids;
``block_ids`` / ``block_hashes`` are those of storage group 0 (the prefix group), other
storage groups (hybrid models) travel in ``groups``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupLease:
    """One lease of one storage group: ``targets[j]`` is the destination block of the
    lease's j-th block (None: that block is pinned but not needed, e.g. an older
    recurrent state or a position past the common prefix)."""

    group: int
    lease: bytes
    targets: tuple[int | None, ...]


@dataclass(frozen=True)
class LoadIntent:
    """Load leased blocks into ``block_ids`` (every destination block, all groups).

    ``lease`` is None when the scheduler could not commit the load (lost lease, layout
    drift): the workers then report ``block_ids`` as load errors and the request as
    finished receiving, so vLLM recomputes instead of waiting forever.

    ``shard_leases[s]`` are TP shard s's leases (one per storage group with something to
    load); empty = one shard, storage group 0 only: ``GroupLease(0, lease, block_ids)``.
    """

    block_ids: tuple[int, ...]
    lease: bytes | None
    num_tokens: int
    shard_leases: tuple[tuple[GroupLease, ...], ...] = ()

    def leases_for(self, shard: int) -> tuple[GroupLease, ...]:
        if self.lease is None:
            return ()
        if not self.shard_leases:
            return (GroupLease(0, self.lease, tuple(self.block_ids)),)
        return self.shard_leases[shard] if shard < len(self.shard_leases) else ()


@dataclass(frozen=True)
class SaveIntent:
    """Save the full blocks ``block_ids`` under ``block_hashes`` (pairwise), storage
    group 0; ``groups``: (storage group, block ids, hashes) of the other groups."""

    block_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]
    groups: tuple[tuple[int, tuple[int, ...], tuple[bytes, ...]], ...] = ()

    def by_group(self) -> dict[int, tuple[tuple[int, ...], tuple[bytes, ...]]]:
        out = {0: (self.block_ids, self.block_hashes)}
        for g, ids, hs in self.groups:
            out[g] = (ids, hs)
        return out


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
