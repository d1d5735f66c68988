"""The workload: multi-turn conversations opening with shared system prompts whose
popularity is Zipf-distributed, routed across nodes.

A request is one turn: system prompt + every earlier user message and answer + the new
user message. The next turn of a conversation exists only once the previous answer came
back (its tokens are the node's output), so later turns re-use the prefix another node
may have computed (round-robin routing) - which is what makes P2P matter. Everything is
drawn from one seeded generator: the same seed gives the same prompts and routing
decisions (the timing of answers can still reorder later turns).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Conversation:
    cid: int
    tokens: list[int]  # the context so far (system prompt, turns, answers)
    turns_left: int
    turn: int = 0
    busy: bool = False
    node: int | None = None  # sticky routing


@dataclass
class Workload:
    seed: int
    nodes: int
    route: str = "round-robin"
    system_prompts: int = 8
    zipf_s: float = 1.1
    sys_len: tuple[int, int] = (96, 256)
    user_len: tuple[int, int] = (16, 64)
    turns: tuple[int, int] = (1, 4)
    max_tokens: tuple[int, int] = (8, 24)
    p_continue: float = 0.6
    rng: random.Random = field(init=False)
    prompts: list[list[int]] = field(init=False)
    weights: list[float] = field(init=False)
    convs: dict[int, Conversation] = field(default_factory=dict)
    _rr: int = 0
    _next_cid: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.prompts = [self._toks(self.rng.randint(*self.sys_len))
                        for _ in range(self.system_prompts)]
        self.weights = [1.0 / (k + 1) ** self.zipf_s for k in range(self.system_prompts)]

    def _toks(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 30000) for _ in range(n)]

    def _route(self, conv: Conversation) -> int:
        if self.route == "sticky":
            if conv.node is None:
                conv.node = conv.cid % self.nodes
            return conv.node
        if self.route == "random":
            return self.rng.randrange(self.nodes)
        n = self._rr % self.nodes
        self._rr += 1
        return n

    def next_request(self) -> tuple[str, int, list[int], int, int]:
        """(request id, node index, prompt, max_tokens, conversation id)."""
        idle = [c for c in self.convs.values() if not c.busy and c.turns_left > 0]
        if idle and self.rng.random() < self.p_continue:
            conv = self.rng.choice(idle)
        else:
            k = self.rng.choices(range(self.system_prompts), weights=self.weights)[0]
            conv = Conversation(self._next_cid, list(self.prompts[k]),
                                self.rng.randint(*self.turns))
            self.convs[conv.cid] = conv
            self._next_cid += 1
        conv.tokens += self._toks(self.rng.randint(*self.user_len))
        conv.turn += 1
        conv.turns_left -= 1
        conv.busy = True
        rid = f"c{conv.cid}-t{conv.turn}"
        return rid, self._route(conv), list(conv.tokens), self.rng.randint(*self.max_tokens), \
            conv.cid

    def answered(self, cid: int, output: list[int]) -> None:
        conv = self.convs[cid]
        conv.busy = False
        conv.tokens += output
        if conv.turns_left <= 0:
            del self.convs[cid]
