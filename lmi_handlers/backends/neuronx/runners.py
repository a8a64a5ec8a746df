"""How the neuronx backend drives a compiled model, step by step: two batching strategies.

Both work on the compiled batch of B rows (``batch_size``, or ``max_rolling_batch_size`` in rolling
mode); a sequence owns one row, its *slot*, from admission until it is released.

``ContinuousRunner`` (Llama and Mistral, transformers-neuronx continuous batching): each slot has
its own KV-cache positions. A step first decodes every running sequence in one call - one token
per row at its own position (2-D ``cache_ids``), slot ids in ``start_ids`` - then prefills each
new prompt into its slot. The order matters: a decode call writes to *every* slot (the library
fills the rows not named with token 0 at position 0), so prefilling first would clobber the new
prompts. A one-token prompt has no prefill graph to go through and joins the decode call.

``NaiveRunner`` (all other architectures, the static batching every class supports): all rows
share one cache position. Whenever sequences arrive, every occupied row is re-encoded from
scratch - prompt plus tokens generated so far, left-padded to one width with ``start_ids`` marking
where each row starts - and decode steps then feed one token per row at the shared position. Free
rows carry a pad token. When the shared position reaches ``n_positions`` the rows are re-encoded
(compacted) too, so every sequence can use its full budget.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...sequence import SequenceState
from ..rows import Rows
from ..sampler import select_tokens


class _Slots:
    def __init__(self, size: int):
        self.seqs: list[SequenceState | None] = [None] * size

    def admit(self, seq: SequenceState) -> int:
        slot = self.seqs.index(None)  # the engine never admits more than max_batch_size
        self.seqs[slot] = seq
        seq.backend_state = slot
        return slot

    def release(self, seq: SequenceState) -> None:
        slot = seq.backend_state
        if isinstance(slot, int) and self.seqs[slot] is seq:
            self.seqs[slot] = None
        seq.backend_state = None

    def reset(self) -> None:
        for seq in self.seqs:
            if seq is not None:
                seq.backend_state = None
        self.seqs = [None] * len(self.seqs)


class ContinuousRunner:
    name = "continuous_batching"

    def __init__(self, model: Any, torch: Any, batch_size: int):
        self.model, self.torch = model, torch
        self.slots = _Slots(batch_size)

    def step(self, new: Sequence[SequenceState], running: Sequence[SequenceState]) -> dict[int, tuple[int, float]]:
        torch = self.torch
        for seq in new:
            self.slots.admit(seq)
        decoding = sorted(list(running) + [s for s in new if len(s.prompt_ids) == 1], key=lambda s: s.backend_state)
        seqs, rows = [], []
        if decoding:
            ids = torch.tensor([[seq.all_ids[-1]] for seq in decoding], dtype=torch.long)
            cache_ids = torch.tensor([[len(seq.all_ids) - 1] for seq in decoding], dtype=torch.int32)
            seq_ids = torch.tensor([seq.backend_state for seq in decoding], dtype=torch.int32)
            rows.append(self.model.forward(ids, cache_ids, seq_ids))
            seqs += decoding
        prompts = Rows([seq for seq in new if len(seq.prompt_ids) > 1])
        prefilled = prompts.each("prefill", lambda row: self._prefill(prompts.seqs[row]))
        rows += prefilled.values()
        seqs += [prompts.seqs[row] for row in prefilled]
        out: dict[int, Any] = prompts.by_uid()
        if seqs:
            out.update(zip((seq.uid for seq in seqs), select_tokens(torch, torch.cat(rows), seqs)))
        return out

    def _prefill(self, seq: SequenceState) -> Any:
        torch = self.torch
        ids = torch.tensor([seq.prompt_ids], dtype=torch.long)
        cache_ids = torch.arange(len(seq.prompt_ids), dtype=torch.int32)[None]
        return self.model.forward(ids, cache_ids, torch.tensor([seq.backend_state], dtype=torch.int32))

    def release(self, seq: SequenceState) -> None:
        self.slots.release(seq)

    def reset(self) -> None:
        self.slots.reset()


class NaiveRunner:
    name = "naive_rolling_batch"

    def __init__(self, model: Any, torch: Any, batch_size: int, n_positions: int, pad_id: int):
        self.model, self.torch = model, torch
        self.slots = _Slots(batch_size)
        self.n_positions, self.pad_id = n_positions, pad_id
        self.width = 0  # the shared cache position the next decode writes
        self.starts = [0] * batch_size

    def step(self, new: Sequence[SequenceState], running: Sequence[SequenceState]) -> dict[int, tuple[int, float]]:
        for seq in new:
            self.slots.admit(seq)
        logits = self._encode() if new or self.width >= self.n_positions else self._decode()
        active = [seq for seq in self.slots.seqs if seq is not None]
        rows = self.torch.tensor([seq.backend_state for seq in active])
        picked = select_tokens(self.torch, logits[rows], active)
        return {seq.uid: choice for seq, choice in zip(active, picked)}

    def _encode(self) -> Any:
        torch = self.torch
        histories = [seq.all_ids if seq is not None else None for seq in self.slots.seqs]
        width = max(len(h) for h in histories if h is not None)
        ids = torch.full((len(histories), width), self.pad_id, dtype=torch.long)
        # A free row sees only its last (pad) token.
        self.starts = [width - (len(h) if h is not None else 1) for h in histories]
        for row, history in enumerate(histories):
            if history is not None:
                ids[row, self.starts[row]:] = torch.tensor(history)
        logits = self.model.forward(ids, torch.arange(width, dtype=torch.int32),
                                    torch.tensor(self.starts, dtype=torch.int32))
        self.width = width
        return logits

    def _decode(self) -> Any:
        torch = self.torch
        seqs = self.slots.seqs
        ids = torch.tensor([[seq.generated[-1] if seq is not None else self.pad_id] for seq in seqs], dtype=torch.long)
        starts = [start if seq is not None else self.width for seq, start in zip(seqs, self.starts)]
        logits = self.model.forward(ids, torch.tensor([self.width], dtype=torch.int32),
                                    torch.tensor(starts, dtype=torch.int32))
        self.width += 1
        return logits

    def release(self, seq: SequenceState) -> None:
        self.slots.release(seq)

    def reset(self) -> None:
        self.slots.reset()
        self.width = 0
