from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    """Only the fields Request reads."""

    max_tokens: int | None = 16
    extra_args: dict[str, Any] | None = None
    structured_outputs: Any = None
    prompt_logprobs: int | None = None
    logprobs: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
