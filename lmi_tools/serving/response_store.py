"""The Responses API's stored responses: what ``previous_response_id``, ``GET /v1/responses/{id}`` and
``POST /v1/responses/{id}/cancel`` read.

The store lives in the server's memory, per server process, and is bounded: at most ``MAX_RESPONSES`` responses and
``MAX_CHARACTERS`` characters of conversation in all; beyond either, the oldest responses are forgotten first (a
later ``previous_response_id`` naming one is a 404). A response the client sent with ``"store": false`` is never
kept. Nothing survives a restart, as with vLLM's in-memory store.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

MAX_RESPONSES = 1024
MAX_CHARACTERS = 64 * 1024 * 1024


@dataclass
class Stored:
    """One response: its object as the client reads it, the conversation so far in chat messages (what a
    follow-up continues, without the instructions, which do not carry over), and, while it runs, what cancels it."""

    response: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Set by a cancel: the response's reader stops waiting for the model.
    stop: asyncio.Event | None = None

    @property
    def size(self) -> int:
        return sum(len(str(message.get("content") or "")) + len(str(message.get("tool_calls") or ""))
                   for message in self.history)


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_characters: int = MAX_CHARACTERS):
        self.max_responses, self.max_characters = max_responses, max_characters
        self._items: collections.OrderedDict[str, Stored] = collections.OrderedDict()
        self._characters = 0

    def get(self, response_id: str) -> Stored | None:
        return self._items.get(response_id)

    def put(self, response_id: str, stored: Stored) -> None:
        """Keep (or replace) a response as the newest, forgetting the oldest beyond the bounds."""
        old = self._items.pop(response_id, None)
        if old is not None:
            self._characters -= old.size
        self._items[response_id] = stored
        self._characters += stored.size
        while len(self._items) > self.max_responses or (self._characters > self.max_characters and
                                                         len(self._items) > 1):
            _, dropped = self._items.popitem(last=False)
            self._characters -= dropped.size

    def delete(self, response_id: str) -> bool:
        stored = self._items.pop(response_id, None)
        if stored is not None:
            self._characters -= stored.size
        return stored is not None
