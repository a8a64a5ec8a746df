"""Next-token selection from logits, shared by the torch backends (hf, neuronx).

Greedy rows without a repetition penalty take one batched argmax. Other rows go through
transformers' own logits processors (repetition penalty, temperature, top-k, top-p) and draw from
a per-request ``torch.Generator``, so a seeded request samples the same tokens whatever else is in
the batch. ``log_prob`` is the log-softmax of the raw model logits at the chosen token.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..sequence import SequenceState


class _RowSampler:
    def __init__(self, torch: Any, seq: SequenceState, device: Any):
        from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                            TemperatureLogitsWarper, TopKLogitsWarper,
                                                            TopPLogitsWarper)

        params = seq.request.sampling
        processors = LogitsProcessorList()
        if params.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if params.do_sample:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        self.processors = processors
        self.generator = None
        if params.do_sample:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seq.seed if seq.seed is not None else 0)


def select_tokens(torch: Any, logits: Any, seqs: Sequence[SequenceState]) -> list[tuple[int, float]]:
    """One (token id, log prob) per row of ``logits`` ([rows, vocab], float)."""
    logits = logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)
    chosen = logits.argmax(dim=-1).tolist()
    for row, seq in enumerate(seqs):
        params = seq.request.sampling
        if params.greedy and params.repetition_penalty == 1.0:
            continue
        if seq.sampler_state is None:
            seq.sampler_state = _RowSampler(torch, seq, logits.device)
        state = seq.sampler_state
        ids = torch.tensor([seq.all_ids], device=logits.device)
        scores = state.processors(ids, logits[row:row + 1].clone())
        if params.greedy:
            chosen[row] = int(scores.argmax(dim=-1))
        else:
            probs = torch.softmax(scores, dim=-1)
            chosen[row] = int(torch.multinomial(probs, 1, generator=state.generator))
    picked = log_probs[torch.arange(len(chosen), device=logits.device), torch.tensor(chosen, device=logits.device)]
    return list(zip(chosen, picked.tolist()))
