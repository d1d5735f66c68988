"""Hybrid models (an attention group + a Mamba-style recurrent-state group): per-group
saves and loads byte-exact, membership gaps, no state, a destination without a state,
the want-set form, Loading answers, a second full-attention group ([fake] and [real])."""

from __future__ import annotations

import pytest

from modelkit import (ATT, BS, GROUPS, MAM, FakeB, Hybrid, Req, hashes, page, q_calls, rng,
                      wait_finished, wait_hits)
from modelkit import backend  # noqa: F401 (fixtures)
from pegaflow.connector.config import FULL, CacheGroup


def test_hybrid_saves_both_groups_and_loads_them_byte_exact(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("p", 5)
    att_a = [1, 2, 3, 4, 5, 6]
    mam_a = [0, 0, 0, 0, 9, 10]  # align mode: older states null, the state after 80 tokens
    a.save_steps("a", hs, 85, att_a, mam_a, [80, 5], r)
    if B.name == "fake":
        saves = [c[1]["layers"] for c in B.servers[0].calls if c[0] == "save"]
        assert saves == [[(ATT, [1, 2, 3, 4, 5], hs), (MAM, [9], [hs[4]])]]
    b = Hybrid(B, "B")  # another vLLM on the same node
    att_b = [11, 12, 13, 14, 15, 16]
    mam_b = [0, 0, 0, 0, 17, 18]
    got, plan, (_, recv), errs = b.load("b", hs, 85, att_b, mam_b)
    assert got == (80, True) and recv == {"b"} and errs == set()
    lg = plan.loads["b"].leases_for(0)
    assert [(x.group, x.targets) for x in lg] == [(0, (11, 12, 13, 14, 15)), (1, (17,))]
    for sa, sb in zip(att_a[:5], att_b[:5]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    assert not page(b.mam, 18).any()  # the running block is not written
    if B.name == "fake":
        assert [(q["group"], q["n"]) for q in q_calls(B) if q["req_id"].startswith("b")] == \
            [(0, 5), (1, 5)]
        assert not B.servers[0].leases  # both leases consumed by the one worker
    a.close()
    b.close()


def test_hybrid_membership_gap_moves_the_resume_point_back(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("g", 5)
    # steps of 48 and 37 tokens: a state at block 2 only (85 is not a block boundary)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 0, 8], [48, 37], r)
    b = Hybrid(B, "B")
    got, plan, (_, recv), errs = b.load("b", hs, 85, [11, 12, 13, 0, 0, 0],
                                        [0, 0, 17, 0, 0, 0])
    assert got == (48, True) and recv == {"b"} and not errs
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 7))
    assert [bytes(page(b.att, x)) for x in (11, 12, 13)] == \
        [bytes(page(a.att, x)) for x in (1, 2, 3)]
    assert b.s.stats["releases"] == 1  # the 5-block prefix lease, after the 3-block one
    if B.name == "fake":
        assert [q["n"] for q in q_calls(B, group=0, req_id="b")] == [5, 3]
        assert not B.servers[0].leases
    a.close()
    b.close()


def test_hybrid_without_any_state_is_a_miss_and_releases_the_prefix_lease(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("m", 3)
    a.save_steps("a", hs, 55, [1, 2, 3, 4], [0, 0, 0, 0], [55], r)  # never on a boundary
    wait_hits(B, 0, "A", hs, 3)  # the attention blocks are there (sealed asynchronously)
    b = Hybrid(B, "B")
    got, plan, _, _ = b.load("b", hs, 55, [5, 6, 7, 8], [0, 0, 9, 10])
    assert got == (0, False) and not plan.loads
    assert b.s.stats["releases"] == 1 and b.s.stats["release_errors"] == 0
    a.close()
    b.close()


def test_hybrid_destination_without_a_stored_state_fails_the_commit(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("d", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    b = Hybrid(B, "B")
    # vLLM allocated a real state block at position 1 too: nothing stored there
    got, plan, (_, recv), errs = b.load("b", hs, 85, [11, 12, 13, 14, 15, 16],
                                        [0, 19, 0, 0, 17, 18])
    assert got == (80, True)
    assert plan.loads["b"].lease is None and recv == {"b"}
    assert errs == {11, 12, 13, 14, 15, 19, 17}  # every destination block, both groups
    assert b.s.stats["commit_failures"] == 1 and b.s.stats["release_errors"] == 0
    if B.name == "fake":
        assert not B.servers[0].leases
    a.close()
    b.close()


def test_hybrid_want_set_asks_for_the_resume_state_then_falls_back(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("w", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 0, 8], [48, 37], r)
    b = Hybrid(B, "B", wait_for_full_prefix=True)
    got, plan, (_, recv), _ = b.load("b", hs, 85, [11, 12, 13, 0, 0, 0], [0, 0, 17, 0, 0, 0])
    assert got == (48, True) and recv == {"b"}
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 7))
    if B.name == "fake":
        # the want-set (the state at block 4) is short: a membership query finds block 2's
        assert [(q["req_id"], q["n"]) for q in q_calls(B, group=1)
                if q["req_id"].startswith("b")] == [("b:group-1", 1), ("b:group-1:any", 5)]
    a.close()
    b.close()


def test_a_second_full_attention_group_needs_every_block_of_the_prefix():
    from fakes import group_key

    r = rng()
    B = FakeB()
    groups = (GROUPS[0], CacheGroup(1, 1, FULL, (MAM,), BS))  # e.g. mamba_cache_mode "all"
    a = Hybrid(B, "A", groups=groups)
    hs = hashes("f2", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [80, 5], r)
    saves = [c[1]["layers"] for c in B.servers[0].calls if c[0] == "save"]
    assert saves[0][1] == (MAM, [7, 8, 9, 10, 11], hs)
    del B.servers[0].blocks[("ns-hybrid", group_key(hs[3], 1))]  # a gap at block 3
    b = Hybrid(B, "B", groups=groups)
    got, plan, (_, recv), errs = b.load("b", hs, 85, [13, 14, 15, 0, 0, 0],
                                        [16, 17, 18, 0, 0, 0])
    assert got == (48, True) and recv == {"b"} and not errs  # the leading run: 3 blocks
    lg = plan.loads["b"].leases_for(0)
    assert [(x.group, x.targets) for x in lg] == [(0, (13, 14, 15)), (1, (16, 17, 18, None))]
    assert [bytes(page(b.mam, x)) for x in (16, 17, 18)] == \
        [bytes(page(a.mam, x)) for x in (7, 8, 9)]
    assert not B.servers[0].leases


def test_hybrid_state_group_loading_answer_is_polled():
    r = rng()
    B = FakeB()
    a = Hybrid(B, "A")
    hs = hashes("l", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    b = Hybrid(B, "B")
    B.servers[0].loading["b:group-1"] = 1
    req = Req("b", hs, 85)
    assert b.s.get_num_new_matched_tokens(req, 0) == (None, False)
    assert not B.servers[0].leases  # the prefix lease of the unfinished answer was released
    assert b.s.get_num_new_matched_tokens(req, 0) == (80, True)


def test_a_worker_without_layers_of_a_group_still_consumes_its_lease_share(backend):
    """PP: a stage holding no state layer gets the state group's lease too; its Load names
    no layer (nothing copied), so every share of the lease is consumed."""
    from pegaflow.connector.plan import GroupLease, LoadIntent, StepPlan

    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("pp", 2)
    a.save_steps("a", hs, 40, [1, 2, 3], [0, 4, 5], [32, 8], r)
    c = B.client()
    q0 = c.query("A", "x", hs)
    q1 = c.query("A", "x:g1", hs, group_id=1)
    assert q0.num_hit_blocks == 2 and q1.hit_positions == (1,)
    w = a.w
    w.group_layers = {0: w.group_layers[0]}  # as on a stage without the state layer
    page(a.att, 7)[:] = 0
    leases = ((GroupLease(0, q0.lease, (7, 8)), GroupLease(1, q1.lease, (9,))),)
    w.start_load_kv(StepPlan(loads={"b": LoadIntent((7, 8, 9), q0.lease, 2 * BS, leases)}))
    assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
    assert bytes(page(a.att, 7)) == bytes(page(a.att, 1))
    if B.name == "fake":
        assert [x[1]["groups"] for x in B.servers[0].calls if x[0] == "load"] == \
            [[[ATT]], [[]]]
        assert not B.servers[0].leases
    else:
        from pegaflow.client.errors import FailedPrecondition

        for lease in (q0.lease, q1.lease):  # each one's single share consumed
            with pytest.raises(FailedPrecondition):
                c.release(lease)
    a.close()
