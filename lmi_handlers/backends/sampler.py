"""Next-token selection for a whole batch at once, shared by the torch backends (hf, neuronx).

Every row may ask for something different (greedy or sampled, temperature, top-k, top-p, min-p, penalties, logit
bias, seed, top log probabilities), as in TGI's and vLLM's heterogeneous batches; each setting is applied as a tensor
over the rows that use it, with no loop over rows, in vLLM's order (``vllm/v1/sample/sampler.py``): logit bias, then
the repetition, frequency and presence penalties (greedy rows take the argmax here), then temperature, min-p, top-k
and top-p. transformers applies the same processors in the same order, but min-p after top-k and top-p; the two
orders differ only for a row that sets both min-p and top-p. A row that sets none of a step leaves it out: its token
is the one it would get alone.

* The repetition penalty counts prompt and output tokens (as transformers and vLLM do), the frequency and presence
  penalties output tokens only (OpenAI's definition, vLLM's formula: ``logit - frequency * count - presence *
  (count > 0)``). Each reads per-sequence state built once and updated with each chosen token, not the history
  rebuilt every step: a ``[vocab]`` bit set of the tokens seen, a ``[vocab]`` count of the tokens generated.
* Over large batches on the CPU (``BLOCKWISE_FROM`` logits) the argmax and the draws go block by block: a
  vectorized max or sum per 64 logits, then inside the one block that holds the answer. On a GPU torch's own
  argmax and cumsum are one kernel each and stay.
* A temperature-1 row that nothing else changes draws from the exp(logit - max) the log probabilities need anyway.
* Sampled rows draw by inverse CDF: one uniform number per row from the request's own
  ``torch.Generator`` (seeded by the request, or the server), so a seeded request samples the same tokens
  whatever else is in the batch.
* Only rows whose top-k or top-p cuts something off sort their logits (top-p needs them in order); the others
  draw in vocabulary order: sorting a vocabulary's logits costs about as much as the model's whole decode step
  on a CPU (docs/engine.md, "Figures"). Which way a row goes depends on its own parameters only.

``log_prob`` is the log-softmax of the model's logits at the chosen token, before bias, penalties and temperature
(vLLM's default ``logprobs_mode``, ``raw_logprobs``); a constrained row's are those of its grammar's masked
distribution. A row that asks for ``top_logprobs`` gets that many most likely tokens from the same distribution,
most likely first; only those rows pay for the ``topk``.

A row whose grammar, random draw or selection fails gets its ``SequenceFailed`` in place of a token, and the other
rows are chosen as without it (``rows.py``): the draws are taken row by row before the batched selection, and the
chosen tokens join the penalties' state after it, so that a selection run again row by row draws and counts
nothing twice.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..schemas import OFF_VALUES
from ..sequence import SequenceState
from .rows import Rows

#: The request fields ``select_tokens`` honours beyond the common ones: every one ``schemas.OFF_VALUES`` names. A
#: backend that chooses its tokens here lists them as its ``request_fields``.
HONOURED_FIELDS = frozenset(OFF_VALUES)


class _RowState:
    """What selection keeps per sequence: its random generator, this step's number drawn from it, the set of tokens
    it has seen (prompt and output) and how often it generated each token."""

    __slots__ = ("generator", "seen", "counts", "drawn")

    def __init__(self) -> None:
        self.generator: Any = None
        self.seen: Any = None
        self.counts: Any = None
        self.drawn: Any = None


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


def _counts(torch: Any, seq: SequenceState, vocab: int, device: Any) -> Any:
    state = _state(seq)
    if state.counts is None:
        state.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        if seq.generated:
            ids = torch.tensor(seq.generated, device=device)
            state.counts.index_add_(0, ids, torch.ones(len(seq.generated), device=device))
    return state.counts


def _uniform(torch: Any, seq: SequenceState, device: Any) -> Any:
    state = _state(seq)
    if state.generator is None:
        state.generator = torch.Generator(device=device)
        state.generator.manual_seed(seq.seed if seq.seed is not None else 0)
    return torch.rand(1, generator=state.generator, device=device)


def _counted(params: Any) -> bool:
    return params.frequency_penalty is not None or params.presence_penalty is not None


def _adjusts(params: Any) -> bool:
    """Whether the row's scores differ from its logits (logit bias or a penalty)."""
    return bool(params.logit_bias) or params.repetition_penalty != 1.0 or _counted(params)


def _rows_where(torch: Any, params: Sequence[Any], test: Any, device: Any) -> tuple[list[int], Any]:
    rows = [row for row, p in enumerate(params) if test(p)]
    return rows, torch.tensor(rows, device=device)


def _adjusted(torch: Any, logits: Any, seqs: Sequence[SequenceState], params: Sequence[Any]) -> Any:
    """The logits after logit bias and the repetition, frequency and presence penalties, in vLLM's order; ``logits``
    itself when no row sets any of them."""
    if not any(_adjusts(p) for p in params):
        return logits
    device, vocab = logits.device, logits.shape[-1]
    scores = logits.clone()
    # An id outside the logits was refused at admission (job.py); one that got here anyway fails no neighbour.
    biased = [(row, token, bias) for row, p in enumerate(params) for token, bias in dict(p.logit_bias or ()).items()
              if token < vocab]
    if biased:
        rows, tokens, biases = zip(*biased)
        scores.index_put_((torch.tensor(rows, device=device), torch.tensor(tokens, device=device)),
                          torch.tensor(biases, dtype=scores.dtype, device=device), accumulate=True)
    rows, index = _rows_where(torch, params, lambda p: p.repetition_penalty != 1.0, device)
    if rows:  # transformers' RepetitionPenaltyLogitsProcessor: divide a positive logit, multiply a negative one
        seen = torch.stack([_seen(torch, seqs[row], vocab, device) for row in rows])
        penalty = torch.tensor([params[row].repetition_penalty for row in rows], device=device)[:, None]
        part = scores[index]
        scores[index] = torch.where(seen, torch.where(part > 0, part / penalty, part * penalty), part)
    rows, index = _rows_where(torch, params, _counted, device)
    if rows:  # vLLM's apply_penalties: OpenAI's frequency and presence penalties over the output tokens
        counts = torch.stack([_counts(torch, seqs[row], vocab, device) for row in rows])
        frequency = torch.tensor([params[row].frequency_penalty or 0.0 for row in rows], device=device)[:, None]
        presence = torch.tensor([params[row].presence_penalty or 0.0 for row in rows], device=device)[:, None]
        part = scores[index]
        part -= frequency * counts
        part -= presence * (counts > 0)
        scores[index] = part
    return scores


def _record(seqs: Sequence[SequenceState], ids: list[int]) -> None:
    """The chosen tokens join the state of the rows that penalize by it."""
    for seq, token in zip(seqs, ids):
        state = seq.sampler_state
        if state is None:
            continue
        if state.seen is not None:
            state.seen[token] = True
        if state.counts is not None:
            state.counts[token] += 1


def _truncates(params: Any, vocab: int) -> bool:
    return 0 < params.top_k < vocab or params.top_p < 1.0


def _min_p(torch: Any, params: Sequence[Any], device: Any) -> Any:
    """Each row's min-p as a column, or None when no row sets one."""
    if all(p.min_p is None for p in params):
        return None
    return torch.tensor([p.min_p or 0.0 for p in params], device=device)[:, None]


def _tempered_probs(torch: Any, scores: Any, params: Sequence[Any]) -> Any:
    """Each row's sampling distribution after temperature and min-p, when neither top-k nor top-p cuts anything off,
    in vocabulary order (min-p's cut leaves a row summing to less than one)."""
    temperature = torch.tensor([p.temperature for p in params], device=scores.device)[:, None]
    probs = torch.softmax(scores / temperature, dim=-1)
    min_p = _min_p(torch, params, scores.device)
    if min_p is not None:  # vLLM's MinPLogitsProcessor: below min_p times the most likely token's probability
        probs = probs.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p, 0.0)
    return probs


def _sorted_probs(torch: Any, scores: Any, params: Sequence[Any]) -> tuple[Any, Any]:
    """Each row's sampling distribution after temperature, min-p, top-k and top-p, in descending-logit order:
    (probabilities, vocabulary index of each column); a row's probabilities may not sum to one."""
    device, vocab = scores.device, scores.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)[:, None]
    top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]
    ordered, order = (scores / temperature).sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    cut = ranks >= top_k
    min_p = _min_p(torch, params, device)
    if min_p is not None:  # before top-k and top-p, as vLLM applies it: top-p reads what min-p left
        full = torch.softmax(ordered, dim=-1)
        cut |= full < full[:, :1] * min_p
    ordered = ordered.masked_fill(cut, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    # top-p: drop a token when the more likely ones already reach p (the most likely always stays).
    probs = probs.masked_fill((probs.cumsum(dim=-1) - probs >= top_p) & (ranks > 0), 0.0)
    return probs, order


def _sample(torch: Any, scores: Any, plain: Any, seqs: Sequence[SequenceState], rows: list[int]) -> Any:
    """The sampled token of each of ``rows``: the rows that truncate (sorted) and the others (vocabulary order);
    ``plain``: exp(logit - max) of every row, the weights of a temperature-1 row that nothing else changes."""
    device, vocab = scores.device, scores.shape[-1]
    picks = torch.empty(len(rows), dtype=torch.long, device=device)

    def way(params: Any) -> str:
        if _truncates(params, vocab):
            return "sorted"
        untouched = params.temperature == 1.0 and params.min_p is None and not _adjusts(params)
        return "plain" if untouched else "tempered"

    ways = [way(seqs[row].request.sampling) for row in rows]
    for kind in ("plain", "tempered", "sorted"):
        group = [i for i, w in enumerate(ways) if w == kind]
        if not group:
            continue
        index = [rows[i] for i in group]
        params = [seqs[row].request.sampling for row in index]
        order = None
        if kind == "sorted":
            weights, order = _sorted_probs(torch, _take(torch, scores, index), params)
        elif kind == "plain":
            weights = _take(torch, plain, index)  # the softmax's numerators: the same draw
        else:
            weights = _tempered_probs(torch, _take(torch, scores, index), params)
        chosen = _draw(torch, weights, torch.cat([seqs[row].sampler_state.drawn for row in index]))
        picks[torch.tensor(group, device=device)] = chosen if order is None else order.gather(1, chosen[:, None])[:, 0]
    return picks


def _take(torch: Any, x: Any, rows: list[int]) -> Any:
    """``x[rows]``, without the copy when that is every row in order."""
    return x if rows == list(range(x.shape[0])) else x[torch.tensor(rows, device=x.device)]


# Over this many logits on the CPU a batch's argmax and draws go block by block: a max or sum per BLOCK logits, then
# inside the one block that holds the answer. torch's CPU max with indices and its cumsum run one element at a time,
# several times slower than its vectorized amax and sum on a large vocabulary; below it their few calls win. A GPU
# runs each as one kernel: there the blocks would only add kernel launches.
BLOCK = 64
BLOCKWISE_FROM = 1 << 16


def _blockwise(x: Any) -> bool:
    return x.device.type == "cpu" and x.numel() >= BLOCKWISE_FROM


def _per_block(torch: Any, x: Any, reduce: Any) -> Any:
    """``reduce`` (amax or sum) over each BLOCK columns of ``x`` ([rows, vocab]); the last block may be shorter."""
    rows, vocab = x.shape
    whole = vocab - vocab % BLOCK
    out = reduce(x[:, :whole].reshape(rows, -1, BLOCK), -1)
    return torch.cat([out, reduce(x[:, whole:], -1)[:, None]], 1) if whole < vocab else out


def _block_columns(torch: Any, block: Any, vocab: int) -> tuple[Any, Any]:
    """Each row's columns of its ``block`` ([rows]): ([rows, BLOCK] clamped to the vocabulary, which are real)."""
    columns = block[:, None] * BLOCK + torch.arange(BLOCK, device=block.device)
    return columns.clamp(max=vocab - 1), columns < vocab


def _argmax(torch: Any, scores: Any) -> Any:
    """Each row's first largest column, as ``scores.argmax(dim=-1)``."""
    if not _blockwise(scores):
        return scores.argmax(dim=-1)
    block = _per_block(torch, scores, torch.amax).argmax(dim=-1)  # the first block holding the maximum
    columns, _ = _block_columns(torch, block, scores.shape[-1])  # a clamped column repeats the last one, after it
    return columns.gather(1, scores.gather(1, columns).argmax(dim=-1, keepdim=True))[:, 0]


def _draw(torch: Any, weights: Any, uniforms: Any) -> Any:
    """One column per row of ``weights`` ([rows, vocab], not negative, any positive sum), each with probability its
    share of the row, by inverse CDF at ``uniforms`` ([rows], in [0, 1)); a column of weight 0 is never drawn."""
    vocab = weights.shape[-1]
    if not _blockwise(weights):
        cumulative = weights.cumsum(dim=-1)
        point = uniforms[:, None] * cumulative[:, -1:]
        return torch.searchsorted(cumulative, point, right=True)[:, 0].clamp(max=vocab - 1)
    sums = _per_block(torch, weights, torch.sum)
    cumulative = sums.cumsum(dim=-1)
    point = uniforms[:, None] * cumulative[:, -1:]
    block = torch.searchsorted(cumulative, point, right=True).clamp(max=sums.shape[-1] - 1)
    point = point - (cumulative.gather(1, block) - sums.gather(1, block))  # the mass before the block
    columns, real = _block_columns(torch, block[:, 0], vocab)
    inside = weights.gather(1, columns) * real
    at = torch.searchsorted(inside.cumsum(dim=-1), point, right=True)
    # the two sums of a block may round apart: never past the block's last column of positive weight
    last = (inside > 0).cumsum(dim=-1).argmax(dim=-1, keepdim=True)
    return columns.gather(1, torch.minimum(at, last))[:, 0]


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
    return int(_draw(torch, probs[None], _uniform(torch, seq, probs.device))[0])


def uniform(torch: Any, seq: SequenceState, device: Any) -> float:
    """One number in [0, 1) from the sequence's own generator."""
    return float(_uniform(torch, seq, device))


def select_tokens(torch: Any, logits: Any, seqs: Sequence[SequenceState], grammars: Any = None) -> list[Any]:
    """One (token id, log prob) per row of ``logits`` ([rows, vocab]), or (token id, log prob, top) for a row that
    asks for ``top_logprobs``: top holds that many (token id, log prob) pairs, most likely first. With ``grammars``
    (``structured.masks.GrammarMasks``), constrained rows choose among the tokens their grammar allows (their
    log probabilities are those of the masked distribution), and a row whose grammar completes gets a list:
    its pick, then end-of-sequence. A row that failed gets its ``errors.SequenceFailed`` instead."""
    rows = Rows(seqs)
    logits = logits.float()
    if grammars is not None:
        logits = grammars.mask(torch, logits, rows)
    rows.each("sampling", lambda row: _draw_for_step(torch, seqs[row], logits.device))
    done, chosen = rows.batched("sampling", lambda live: _choose(torch, _take(torch, logits, live),
                                                                 [seqs[row] for row in live]))
    picks = dict(zip(done, chosen or ()))
    _record([seqs[row] for row in done], [picks[row][0] for row in done])
    if grammars is not None:
        picks = grammars.advance(rows, picks)
    return rows.answer(picks)


def _draw_for_step(torch: Any, seq: SequenceState, device: Any) -> None:
    if seq.request.sampling.do_sample:
        _state(seq).drawn = _uniform(torch, seq, device)


def _choose(torch: Any, logits: Any, seqs: Sequence[SequenceState]) -> list[Any]:
    """Each row's pick as ``select_tokens`` answers it, its random number drawn already (``_draw_for_step``); the
    chosen tokens are not yet recorded for the penalties (``_record``)."""
    params = [seq.request.sampling for seq in seqs]
    sampled = [row for row, p in enumerate(params) if p.do_sample]
    scores = _adjusted(torch, logits, seqs, params)
    top = logits.amax(dim=-1, keepdim=True)
    # exp(logit - max) with torch's exact exp (its fused log_softmax approximates it): the log probabilities'
    # denominators, and the weights a temperature-1 row draws from when nothing else changed its scores.
    plain = (logits - top).exp_()
    chosen = _argmax(torch, scores)
    if sampled:
        chosen[torch.tensor(sampled, device=logits.device)] = _sample(torch, scores, plain, seqs, sampled)
    log_sum = plain.sum(dim=-1).log_()
    log_probs = logits.gather(1, chosen[:, None])[:, 0] - top[:, 0] - log_sum
    ids = chosen.tolist()
    picks: list[Any] = list(zip(ids, log_probs.tolist()))
    for row, alternatives in _top_log_probs(torch, logits, top, log_sum, params).items():
        picks[row] = (*picks[row], alternatives)
    return picks


def _top_log_probs(torch: Any, logits: Any, top: Any, log_sum: Any, params: Sequence[Any]) -> dict[int, Any]:
    """{row: ((token id, log prob), ...)} for the rows that ask for ``top_logprobs``, most likely first."""
    rows = [row for row, p in enumerate(params) if p.top_logprobs]
    if not rows:
        return {}
    index = torch.tensor(rows, device=logits.device)
    # A stable sort, not topk: among equal logits (frequent in bf16) the lowest id comes first, as the argmax
    # chooses, so a greedy token is its position's first alternative.
    values, tokens = logits[index].sort(dim=-1, descending=True, stable=True)
    width = max(params[row].top_logprobs for row in rows)
    values, tokens = values[:, :width] - top[index] - log_sum[index, None], tokens[:, :width]
    out = {}
    for row, row_tokens, row_values in zip(rows, tokens.tolist(), values.tolist()):
        k = params[row].top_logprobs
        out[row] = tuple(zip(row_tokens[:k], row_values[:k]))
    return out
