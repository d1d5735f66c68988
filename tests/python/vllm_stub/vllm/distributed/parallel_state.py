"""Rank getters. Tests set the ranks of "this process" with set_ranks()."""

from dataclasses import dataclass


@dataclass
class GroupCoordinator:
    rank_in_group: int = 0
    world_size: int = 1


_TP = GroupCoordinator()
_PP = GroupCoordinator()
_DCP = GroupCoordinator()


def set_ranks(tp: int = 0, pp: int = 0, dcp: int = 0) -> None:
    """Stub only: the ranks the getters report."""
    _TP.rank_in_group, _PP.rank_in_group, _DCP.rank_in_group = tp, pp, dcp


def get_tensor_model_parallel_rank():
    return _TP.rank_in_group


def get_tensor_model_parallel_world_size():
    return _TP.world_size


def get_pp_group() -> GroupCoordinator:
    return _PP


def get_decode_context_model_parallel_rank():
    return _DCP.rank_in_group
