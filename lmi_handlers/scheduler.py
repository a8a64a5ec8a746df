"""What runs at each engine step: which sequences, and how many of their tokens.

Running sequences go first, oldest first: a decoding one feeds its last token, one whose prompt is being
prefilled in chunks feeds its next chunk. Then waiting sequences are admitted in arrival order while the
batch has rows, the backend's KV pool has blocks for the whole prompt, and the step's prefill token
budget lasts, and its LoRA adapter (if any) keeps the batch within ``option.max_loras`` distinct
adapters. A request that does not fit waits; it never fails for lack of room.

When a decoding sequence needs a new block and the pool is dry, the youngest running sequence is
preempted: its blocks go back, and it waits at the head of the queue to be recomputed (prompt and the
tokens generated so far, prefilled again; with prefix caching most of it is found in the cache). Its
output so far is kept, so nothing is lost or repeated.

The choices of one request (``n`` > 1) arrive together; the first prefills the prompt, and the others wait at the
head of the queue until it has, then share its prompt's KV blocks (``paged_cache.BlockManager``).

Priority (``option.scheduling_policy=priority``, vLLM's engine argument and meaning): the queue is ordered by each
request's ``priority`` (lower first), then by arrival; the victim of a preemption is the running sequence that comes
last in that order rather than the youngest; and a waiting sequence that finds no KV blocks preempts running ones that
come after it, lowest first, until it fits. With ``fcfs`` (the default) every request has priority 0 (``job.py``
refuses another value), which is arrival order.

Budget (``option.max_rolling_batch_prefill_tokens``): without chunked prefill it only limits admission
(one prompt always fits), so that many prompts arriving together are prefilled over several steps and the first
of them answer while the rest wait, instead of all answering after one long prefill; with
``option.enable_chunked_prefill`` long prompts are cut into chunks so a step never prefills more than the budget,
and running streams keep their pace.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Mapping

from .sequence import Chunk, SequenceState
from .values import parse_choice

DEFAULT_CHUNK_BUDGET = 512
#: Prompt tokens admitted per step without chunked prefill, unless the option says otherwise.
DEFAULT_ADMISSION_BUDGET = 1024
#: ``option.scheduling_policy``: vLLM's names.
POLICIES = ("fcfs", "priority")
#: The option this module reads.
KEYS = ("scheduling_policy",)


def priority_scheduling(props: Mapping[str, Any]) -> bool:
    """Whether ``option.scheduling_policy`` (vLLM's engine argument, which LMI passes through) asks for priority."""
    return parse_choice(props, "scheduling_policy", "fcfs", POLICIES) == "priority"


def _rank(seq: SequenceState) -> tuple[int, int]:
    return seq.request.priority, seq.uid  # uids grow with arrival


class Scheduler:
    def __init__(self, backend: Any, prefill_budget: int | None = None, chunked: bool = False,
                 by_priority: bool = False):
        self.backend = backend
        self.by_priority = by_priority
        self.chunked = chunked and getattr(backend, "chunked_prefill", False)
        self.budget = prefill_budget if prefill_budget is not None else \
            DEFAULT_CHUNK_BUDGET if self.chunked else DEFAULT_ADMISSION_BUDGET
        self.preemptions = 0
        #: Distinct LoRA adapters in one batch (``option.max_loras``); None: no limit.
        self.max_adapters: int | None = None

    @property
    def kv(self) -> Any:
        return getattr(self.backend, "kv", None)

    def schedule(self, waiting: deque[SequenceState], running: list[SequenceState]) -> list[Chunk]:
        """This step's chunks; moves admitted sequences from ``waiting`` to ``running`` and preempted ones back."""
        budget = self.budget
        chunks: list[Chunk] = []
        for seq in list(running):
            if seq not in running:  # preempted for an older one earlier in this loop
                continue
            left = seq.length - seq.num_cached
            size = 1 if left == 1 else min(left, budget)
            if size <= 0:
                continue  # a chunked prompt waits for budget
            if left > 1:
                budget -= size
            elif not self._room_for_next_token(seq, waiting, running, chunks):
                continue
            chunks.append(Chunk(seq, seq.num_cached, seq.ids_between(seq.num_cached, seq.num_cached + size)))
        prefilled_any = any(len(chunk.tokens) > 1 for chunk in chunks)
        while waiting and len(running) < self.backend.max_batch_size and budget > 0:
            seq = waiting[0]
            if not self._adapter_fits(seq, running):
                break  # its adapter would exceed option.max_loras: it waits for one to leave the batch
            if self._prompt_pending(seq, running):
                break  # another choice of its request is computing the prompt blocks it will share
            if not self.chunked and prefilled_any and seq.length > budget:
                break  # the rest waits for the next step; one prompt always fits
            cached = self.kv.admit(seq) if self.kv is not None else 0
            while cached is None and self._preempt_for(seq, waiting, running, chunks):
                cached = self.kv.admit(seq)
            if cached is None:
                break  # no blocks for it now: it waits for a sequence to finish
            waiting.popleft()
            running.append(seq)
            seq.num_cached = cached
            size = seq.length - cached if not self.chunked else min(seq.length - cached, budget)
            budget -= size
            prefilled_any = True
            chunks.append(Chunk(seq, cached, seq.ids_between(cached, cached + size)))
        return chunks

    def _adapter_fits(self, seq: SequenceState, running: list[SequenceState]) -> bool:
        if seq.adapter is None or self.max_adapters is None:
            return True
        in_batch = {s.adapter.uid for s in running if s.adapter is not None}
        return seq.adapter.uid in in_batch or len(in_batch) < self.max_adapters

    def _prompt_pending(self, seq: SequenceState, running: list[SequenceState]) -> bool:
        """Whether ``seq`` should wait for the choice it forks from (``n`` > 1) to compute their shared prompt."""
        source = seq.fork_of
        return (source is not None and self.kv is not None and source in running
                and source.num_cached < self.kv.shareable(seq))

    def _room_for_next_token(self, seq: SequenceState, waiting: deque[SequenceState],
                             running: list[SequenceState], chunks: list[Chunk]) -> bool:
        """A block for the token ``seq`` writes this step, preempting the youngest sequences (by priority: the last
        in priority order) if need be."""
        while self.kv is not None and not self.kv.grow(seq, seq.num_cached + 1):
            victim = max(running, key=_rank) if self.by_priority else running[-1]
            self.preempt(victim, waiting, running, chunks)
            if victim is seq:
                return False
        return True

    def _preempt_for(self, seq: SequenceState, waiting: deque[SequenceState], running: list[SequenceState],
                     chunks: list[Chunk]) -> bool:
        """By priority: preempt the running sequence that comes last in priority order, if it comes after ``seq``
        (KV blocks for a more urgent request); returns whether one was."""
        if not self.by_priority or not running:
            return False
        victim = max(running, key=_rank)
        if _rank(victim) < _rank(seq):
            return False
        self.preempt(victim, waiting, running, chunks)
        return True

    def enqueue(self, waiting: deque[SequenceState], seq: SequenceState, front: bool = False) -> None:
        """``seq`` joins the queue: at the back (a preempted one at the front); by priority, before the first
        sequence that comes after it in (priority, arrival) order."""
        if not self.by_priority:
            waiting.appendleft(seq) if front else waiting.append(seq)
            return
        rank = _rank(seq)
        for i, other in enumerate(waiting):
            if _rank(other) > rank:
                waiting.insert(i, seq)
                return
        waiting.append(seq)

    def preempt(self, seq: SequenceState, waiting: deque[SequenceState], running: list[SequenceState],
                chunks: list[Chunk] | None = None) -> None:
        running.remove(seq)
        self.backend.release(seq)
        seq.num_cached = 0
        if chunks:  # it may already have had its chunk of this step
            chunks[:] = [chunk for chunk in chunks if chunk.seq is not seq]
        self.enqueue(waiting, seq, front=True)
        self.preemptions += 1
