"""What generation produces, before any encoding: typed events, never bytes.

A request's stream is ``TokenEvent``s followed by exactly one terminal event: ``GenerationResult``
(success) or ``ErrorEvent`` (failure). An error is not a finish reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(str, enum.Enum):
    """Why generation stopped; the values are the wire strings LMI uses."""

    LENGTH = "length"
    EOS = "eos_token"
    STOP = "stop_sequence"


@dataclass(frozen=True)
class Token:
    id: int
    #: Text this token released to the client; "" while text is held back (an incomplete UTF-8
    #: character or a possible stop sequence), more than one token's worth when it is released.
    text: str
    log_prob: float
    special: bool = False
    #: The most likely alternatives as (id, text, log probability), when the request asked for ``top_logprobs``.
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    token: Token
    #: How many tokens have been generated, this one included.
    index: int


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: FinishReason
    generated_tokens: int
    prompt_tokens: int
    tokens: tuple[Token, ...]
    seed: int | None = None
    #: Speculative decoding: (draft tokens proposed, of which the target accepted), None when it was off.
    speculation: tuple[int, int] | None = None
    #: The stop sequence that ended the answer (``FinishReason.STOP``), as vLLM's ``stop_reason`` tells it.
    stop_sequence: str | None = None

    @property
    def acceptance_rate(self) -> float | None:
        if not self.speculation or not self.speculation[0]:
            return None
        return round(self.speculation[1] / self.speculation[0], 4)


@dataclass(frozen=True)
class ErrorEvent:
    code: int
    message: str


Event = TokenEvent | GenerationResult | ErrorEvent
