"""Next-token selection for a whole batch at once, shared by the torch backends (hf, neuronx).

Every row may ask for something different (greedy or sampled, temperature, top-k, top-p, repetition
penalty, seed), as in TGI's heterogeneous batches; each setting is applied as a tensor over the rows that
use it, in transformers' order (repetition penalty, temperature, top-k, top-p), with no loop over rows.

* A batch of greedy rows without penalty is one max (token and largest logit in one pass).
* Repetition penalty reads a per-sequence bit set of the tokens seen so far (``[vocab]`` booleans, built
  once from the prompt and updated with each chosen token), not the history rebuilt every step.
* Sampled rows draw by inverse CDF: one uniform number per row from the request's own
  ``torch.Generator`` (seeded by the request, or the server), so a seeded request samples the same tokens
  whatever else is in the batch.
* Only rows whose top-k or top-p cuts something off sort their logits (top-p needs them in order); the others
  draw in vocabulary order. A sort of 16 rows of SmolLM2's 49,152 logits took about 50 ms on one core, as
  long as the model's whole decode step. Which way a row goes depends on its own parameters only.

``log_prob`` is the log-softmax of the raw model logits at the chosen token.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..sequence import SequenceState


class _RowState:
    """What selection keeps per sequence: its random generator and the set of tokens it has seen."""

    __slots__ = ("generator", "seen")

    def __init__(self) -> None:
        self.generator: Any = None
        self.seen: Any = None


def _state(seq: SequenceState) -> _RowState:
    if seq.sampler_state is None:
        seq.sampler_state = _RowState()
    return seq.sampler_state


def _seen(torch: Any, seq: SequenceState, vocab: int, device: Any) -> Any:
    state = _state(seq)
    if state.seen is None:
        state.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        state.seen[torch.tensor(seq.all_ids, device=device)] = True
    return state.seen


def _uniform(torch: Any, seq: SequenceState, device: Any) -> Any:
    state = _state(seq)
    if state.generator is None:
        state.generator = torch.Generator(device=device)
        state.generator.manual_seed(seq.seed if seq.seed is not None else 0)
    return torch.rand(1, generator=state.generator, device=device)


def _penalize(torch: Any, scores: Any, seqs: Sequence[SequenceState], rows: list[int]) -> Any:
    device, vocab = scores.device, scores.shape[-1]
    index = torch.tensor(rows, device=device)
    seen = torch.stack([_seen(torch, seqs[row], vocab, device) for row in rows])
    penalty = torch.tensor([seqs[row].request.sampling.repetition_penalty for row in rows], device=device)[:, None]
    part = scores[index]
    penalized = torch.where(part > 0, part / penalty, part * penalty)
    scores = scores.clone()
    scores[index] = torch.where(seen, penalized, part)
    return scores


def _truncates(params: Any, vocab: int) -> bool:
    return 0 < params.top_k < vocab or params.top_p < 1.0


def _tempered_probs(torch: Any, scores: Any, params: Sequence[Any]) -> Any:
    """Each row's sampling distribution when neither top-k nor top-p cuts anything off, in vocabulary order."""
    temperature = torch.tensor([p.temperature for p in params], device=scores.device)[:, None]
    return torch.softmax(scores / temperature, dim=-1)


def _sorted_probs(torch: Any, scores: Any, params: Sequence[Any]) -> tuple[Any, Any]:
    """Each row's sampling distribution after temperature, top-k and top-p, in descending-logit order:
    (probabilities, vocabulary index of each column); a row's probabilities may not sum to one."""
    device, vocab = scores.device, scores.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)[:, None]
    top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]
    ordered, order = (scores / temperature).sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    ordered = ordered.masked_fill(ranks >= top_k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    # top-p: drop a token when the more likely ones already reach p (the most likely always stays).
    probs = probs.masked_fill((probs.cumsum(dim=-1) - probs >= top_p) & (ranks > 0), 0.0)
    return probs, order


def _sample(torch: Any, scores: Any, seqs: Sequence[SequenceState], rows: list[int]) -> Any:
    """The sampled token of each of ``rows``: the rows that truncate (sorted) and the others (vocabulary order)."""
    device, vocab = scores.device, scores.shape[-1]
    picks = torch.empty(len(rows), dtype=torch.long, device=device)
    truncates = [_truncates(seqs[row].request.sampling, vocab) for row in rows]
    for sort in (False, True):
        group = [i for i, t in enumerate(truncates) if t == sort]
        if not group:
            continue
        part = scores[torch.tensor([rows[i] for i in group], device=device)]
        params = [seqs[rows[i]].request.sampling for i in group]
        probs, order = _sorted_probs(torch, part, params) if sort else (_tempered_probs(torch, part, params), None)
        cumulative = probs.cumsum(dim=-1)
        draws = torch.cat([_uniform(torch, seqs[rows[i]], device) for i in group])[:, None] * cumulative[:, -1:]
        chosen = torch.searchsorted(cumulative, draws).clamp(max=vocab - 1)
        picks[torch.tensor(group, device=device)] = (chosen if order is None else order.gather(1, chosen))[:, 0]
    return picks


def distribution(torch: Any, logits: Any, seq: SequenceState) -> Any:
    """The probabilities ``seq`` samples its next token from, for each row of ``logits`` ([rows, vocab], one
    sequence's consecutive positions), normalized, in vocabulary order (speculative decoding compares them)."""
    rows, params = logits.float(), [seq.request.sampling] * logits.shape[0]
    if not _truncates(seq.request.sampling, rows.shape[-1]):
        return _tempered_probs(torch, rows, params)
    probs, order = _sorted_probs(torch, rows, params)
    out = torch.zeros_like(probs).scatter_(1, order, probs)
    return out / out.sum(dim=-1, keepdim=True)


def draw(torch: Any, probs: Any, seq: SequenceState) -> int:
    """One token from ``probs`` ([vocab], summing to one or less) with the sequence's own generator."""
    cumulative = probs.cumsum(dim=-1)
    point = _uniform(torch, seq, probs.device) * cumulative[-1]
    return int(torch.searchsorted(cumulative, point).clamp(max=probs.shape[-1] - 1))


def uniform(torch: Any, seq: SequenceState, device: Any) -> float:
    """One number in [0, 1) from the sequence's own generator."""
    return float(_uniform(torch, seq, device))


def select_tokens(torch: Any, logits: Any, seqs: Sequence[SequenceState]) -> list[tuple[int, float]]:
    """One (token id, log prob) per row of ``logits`` ([rows, vocab])."""
    logits = logits.float()
    params = [seq.request.sampling for seq in seqs]
    penalized = [row for row, p in enumerate(params) if p.repetition_penalty != 1.0]
    sampled = [row for row, p in enumerate(params) if p.do_sample]
    scores = _penalize(torch, logits, seqs, penalized) if penalized else logits
    # max, not argmax: one pass gives the greedy token (the first of equal maxima, as argmax) and the
    # largest logit the log-sum-exp below needs; over a 49k vocabulary argmax + logsumexp took up to 1.6x as long.
    best, chosen = scores.max(dim=-1)
    if sampled:
        chosen[torch.tensor(sampled, device=logits.device)] = _sample(torch, scores, seqs, sampled)
    # log_softmax at one token per row, without writing out a [rows, vocab] tensor of log probabilities.
    top = best if scores is logits else logits.amax(dim=-1)
    log_probs = logits.gather(1, chosen[:, None])[:, 0] - top - (logits - top[:, None]).exp_().sum(dim=-1).log_()
    ids = chosen.tolist()
    for row in penalized:
        seqs[row].sampler_state.seen[ids[row]] = True
    return list(zip(ids, log_probs.tolist()))
