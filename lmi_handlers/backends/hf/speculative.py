"""Speculative decoding in the hf backend's paged runner (``option.speculative_draft_model``).

A proposer guesses the next ``k`` tokens of a decoding sequence; the target model checks them in the step's
decode forward as a chunk of ``k + 1`` tokens (the sequence's last token and the guesses), and the runner keeps
the longest prefix of guesses the target agrees with plus one token of the target's own: 1 to ``k + 1`` tokens
for one target forward. The engine appends them; the KV slots of refused guesses are written over later
(``num_cached`` stops after the last verified token).

Proposers:

* a draft model (``option.speculative_draft_model=/dir``): a second ``HFBackend`` with its own paged KV pool,
  run ``k`` times per step batched over the speculating rows. Its tokenizer must equal the target's.
* prompt lookup (``option.speculative_draft_model=[ngram]``, vLLM's reserved value): the tokens that followed the
  latest earlier occurrence of the sequence's last ``n`` tokens in its prompt or output, ``n`` from
  ``option.ngram_prompt_lookup_max`` down to ``option.ngram_prompt_lookup_min``. Free, and strong on
  input-grounded work (summaries that quote, extraction, code edits).

Acceptance: a greedy row keeps a guess while it equals the target's argmax, so its output is the target's greedy
output. A sampled row uses rejection sampling (Leviathan et al. 2023; Chen et al. 2023): guess ``x`` drawn from
the draft's ``q`` is kept with probability ``min(1, p(x) / q(x))``; at the first refusal the token is drawn from
``norm(max(p - q, 0))``; when every guess is kept a bonus token is drawn from ``p``. The emitted tokens then follow
the target's distribution ``p`` (after temperature, top-k, top-p) exactly. Prompt lookup is a point mass
(``q(x) = 1``). Rows with a penalty do not speculate: the penalty at each guessed position would depend on the
guesses before it; nor do rows with a logit bias, min-p or top log probabilities, which the verification does not
apply.

Fallback: each sequence keeps a running acceptance estimate and asks for the expected run of accepted guesses
(at most ``option.speculative_length``), none below ``MIN_ACCEPTANCE`` except a one-token probe every
``PROBE_EVERY`` steps. The step then caps every row's guesses at the length that maximizes expected tokens per
second under a cost model of the forwards measured at load (``ForwardCost``), and at zero when plain decoding is
expected to be faster, as it often is for a draft model in a full batch.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ...config import ConfigError, parse_int
from ...sequence import Chunk, SequenceState
from .quantize import parse_method
from ..sampler import distribution, draw, uniform

logger = logging.getLogger(__name__)

NGRAM = "[ngram]"
SPECULATIVE_KEYS = frozenset({"speculative_draft_model", "speculative_length", "speculative_draft_quantize",
                              "ngram_prompt_lookup_max", "ngram_prompt_lookup_min"})
DEFAULT_LENGTH = 5
MAX_LENGTH = 16
MIN_ACCEPTANCE = 0.2
PROBE_EVERY = 8
PRIOR = 0.6  # acceptance assumed before a sequence's first verification
SMOOTHING = 0.3  # weight of the latest step in the running estimate


@dataclass(frozen=True)
class SpeculativeOptions:
    #: The draft model's directory, or None for prompt lookup.
    draft: str | None
    length: int
    lookup_max: int
    lookup_min: int
    #: ``option.speculative_draft_quantize``: the draft's own ``option.quantize`` (e.g. an int8 copy of the target).
    draft_quantize: str | None


def parse_options(props: Mapping[str, Any]) -> SpeculativeOptions | None:
    """The speculative options as the hf backend reads them; None when ``speculative_draft_model`` is unset."""
    draft = str(props.get("speculative_draft_model") or "").strip()
    rest = sorted(k for k in SPECULATIVE_KEYS - {"speculative_draft_model"} if str(props.get(k) or "").strip())
    if not draft:
        if rest:
            raise ConfigError(rest[0], props[rest[0]], "it only applies with option.speculative_draft_model "
                              f"(a draft model directory, or {NGRAM} for prompt lookup)")
        return None
    length = parse_int(props, "speculative_length", DEFAULT_LENGTH, maximum=MAX_LENGTH)
    lookup_max = parse_int(props, "ngram_prompt_lookup_max", 4, maximum=64)
    lookup_min = parse_int(props, "ngram_prompt_lookup_min", 1, maximum=lookup_max)
    ngram = draft.lower() == NGRAM
    if ngram and props.get("speculative_draft_quantize"):
        raise ConfigError("speculative_draft_quantize", props["speculative_draft_quantize"],
                          f"prompt lookup ({NGRAM}) has no draft model to quantize")
    try:
        draft_quantize = parse_method(props.get("speculative_draft_quantize"))
    except ConfigError as exc:
        raise ConfigError("speculative_draft_quantize", exc.value, exc.allowed) from None
    return SpeculativeOptions(None if ngram else draft, length, lookup_max, lookup_min, draft_quantize)


def tokenizer_mismatch(target: Any, draft: Any) -> str | None:
    """How two transformers tokenizers differ (vocabulary, then special tokens), or None when they agree."""
    ours, theirs = target.get_vocab(), draft.get_vocab()
    if ours != theirs:
        only = sorted(set(theirs.items()) - set(ours.items()))[:3]
        return (f"vocabularies differ ({len(ours)} tokens against {len(theirs)}; the draft has e.g. "
                f"{', '.join(f'{t!r}={i}' for t, i in only) or 'none of its own'})")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(target, name, None) != getattr(draft, name, None):
            return f"{name} differs ({getattr(target, name, None)} against {getattr(draft, name, None)})"
    if sorted(target.all_special_ids) != sorted(draft.all_special_ids):
        return f"special tokens differ ({sorted(target.all_special_ids)} against {sorted(draft.all_special_ids)})"
    return None


def load_draft_tokenizer(draft_dir: str, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(draft_dir, **kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError("speculative_draft_model", draft_dir, f"no draft model's tokenizer loads from there "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); give a model "
                          f"directory with the target's tokenizer, or {NGRAM} for prompt lookup") from None


def check_draft_tokenizer(target_dir: str, draft_dir: str, target: Any, draft: Any) -> None:
    problem = tokenizer_mismatch(target, draft)
    if problem:
        raise ConfigError("speculative_draft_model", draft_dir, f"the draft's tokenizer must equal the target's "
                          f"({target_dir}), but {problem}")


def ngram_proposal(ids: Sequence[int], k: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last ``n`` tokens of ``ids``."""
    length = len(ids)
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        tail = list(ids[length - n:])
        first = tail[0]
        for start in range(length - n - 1, -1, -1):  # latest first: recent context predicts best
            if ids[start] == first and list(ids[start:start + n]) == tail:
                return list(ids[start + n:start + n + k])
    return []


@dataclass
class Proposal:
    tokens: list[int]
    #: The draft's probabilities for each guess (``[k, vocab]``), or None for a point mass (prompt lookup, greedy).
    q: Any = None


class _Track:
    """One sequence's running acceptance estimate and the guesses it asks for."""

    __slots__ = ("estimate", "idle", "checks", "since")

    def __init__(self) -> None:
        self.estimate = PRIOR
        self.idle = 0
        self.checks = 0  # verifications so far
        self.since = 0  # steps since the last one

    def exploring(self) -> bool:
        """Whether to guess even where the cost model says no: to learn the acceptance of a new sequence, and
        to re-learn it now and then (the text may have become predictable)."""
        return self.checks < 2 or self.since >= PROBE_EVERY

    def wanted(self, length: int) -> int:
        self.since += 1
        if self.estimate < MIN_ACCEPTANCE:
            self.idle += 1
            if self.idle < PROBE_EVERY:
                return 0
            self.idle = 0
            return 1
        run = self.estimate / (1 - self.estimate) if self.estimate < 1 else float(length)
        return min(length, math.ceil(run) + 1)

    def update(self, proposed: int, accepted: int) -> None:
        self.checks += 1
        self.since = 0
        self.estimate = (1 - SMOOTHING) * self.estimate + SMOOTHING * accepted / proposed


def expected_tokens(acceptance: float, guesses: int) -> float:
    """Tokens one verification yields with ``guesses`` guesses each kept with probability ``acceptance``."""
    a = min(acceptance, 0.99)
    return (1 - a ** (guesses + 1)) / (1 - a)


@dataclass
class ForwardCost:
    """Seconds of one forward as ``scale * (fixed + per_token * tokens)`` (weights streamed once, then work per
    token). ``fixed`` and ``per_token`` are timed at load; ``scale`` follows the forwards actually timed while
    serving, so a machine that got busier (or a draft slower than its load-time timing) is seen."""

    fixed: float
    per_token: float
    scale: float = 1.0

    def __call__(self, tokens: int) -> float:
        return self.scale * (self.fixed + self.per_token * tokens)

    def observe(self, tokens: int, seconds: float) -> None:
        predicted = self.fixed + self.per_token * tokens
        if predicted > 0:
            self.scale = (1 - SMOOTHING) * self.scale + SMOOTHING * seconds / predicted


def measure_cost(runner: Any, torch: Any, tokens: int = 24, repeats: int = 3) -> ForwardCost:
    """Time a 1-token and a ``tokens``-token forward of ``runner`` (a ``PagedRunner``) on a probe sequence."""
    from ...request import GenerationRequest, SamplingParams, Schema, StoppingParams

    request = GenerationRequest(Schema.LMI, "probe", SamplingParams(), StoppingParams(max_new_tokens=1))
    seq = SequenceState(request, [(7 * i + 3) % 100 + 1 for i in range(2 * tokens)], decode=lambda ids: "")
    timings = {}
    with torch.inference_mode():
        try:
            runner.blocks.admit(seq)
            runner._forward([Chunk(seq, 0, seq.all_ids[:tokens])])  # warm up, and fill what the reads see
            for width in (1, tokens):
                best = float("inf")
                for _ in range(repeats):
                    began = time.perf_counter()
                    runner._forward([Chunk(seq, tokens, seq.all_ids[tokens:tokens + width])])
                    best = min(best, time.perf_counter() - began)
                timings[width] = best
        finally:
            runner.reset()
    per_token = max(timings[tokens] - timings[1], 0.0) / (tokens - 1)
    return ForwardCost(max(timings[1] - per_token, 1e-6), per_token)


class DraftProposer:
    """Guesses from a draft model's ``PagedRunner``; its pool keeps each sequence's tokens up to ``cached``."""

    def __init__(self, runner: Any, torch: Any, max_sequence_length: int):
        self.runner = runner
        self.torch = torch
        self.max_sequence_length = max_sequence_length
        self.cached: dict[int, int] = {}
        self.written: dict[int, int] = {}
        self.cost = measure_cost(runner, torch)

    def step_cost(self, rows: int, guesses: int) -> float:
        return guesses * self.cost(rows)

    def propose(self, wanted: Sequence[tuple[SequenceState, int]]) -> dict[int, Proposal]:
        rows, proposals = [], {}
        for seq, k in wanted:
            k = self._room(seq, k)
            if k > 0:
                proposals[seq.uid] = Proposal([], [] if seq.request.sampling.do_sample else None)
                rows.append((seq, k, proposals[seq.uid]))
        chunks = [Chunk(seq, self.cached[seq.uid], seq.all_ids[self.cached[seq.uid]:]) for seq, _, _ in rows]
        while rows:
            began = time.perf_counter()
            logits = self.runner._forward(chunks).float()
            for (seq, _, proposal), row in zip(rows, logits):
                if proposal.q is None:
                    proposal.tokens.append(int(row.argmax()))
                else:
                    proposal.q.append(distribution(self.torch, row[None], seq)[0])
                    proposal.tokens.append(draw(self.torch, proposal.q[-1], seq))
            self.cost.observe(sum(len(c.tokens) for c in chunks), time.perf_counter() - began)
            for seq, k, proposal in rows:
                if len(proposal.tokens) == k:
                    self.written[seq.uid] = seq.length + k - 1
                    if proposal.q is not None:
                        proposal.q = self.torch.stack(proposal.q)
            rows = [row for row in rows if len(row[2].tokens) < row[1]]
            chunks = [Chunk(seq, seq.length + len(p.tokens) - 1, p.tokens[-1:]) for seq, _, p in rows]
        return proposals

    def _room(self, seq: SequenceState, k: int) -> int:
        """How many guesses the draft's pool and positions allow ``seq`` (admitting it on first sight)."""
        blocks = self.runner.blocks
        if seq.uid not in self.cached:
            if blocks.admit(seq) is None:
                return 0
            self.cached[seq.uid] = 0
        blocks.grow(seq, seq.length + k - 1)
        room = len(blocks.table(seq)) * blocks.block_size - seq.length + 1
        return min(k, room, self.max_sequence_length - seq.length + 1)

    def verified(self, seq: SequenceState, old_length: int, accepted: int) -> None:
        """The target kept ``accepted`` guesses: the draft's cache is right up to there."""
        if seq.uid in self.written:
            self.cached[seq.uid] = min(self.written.pop(seq.uid), old_length + accepted)

    def release(self, seq: SequenceState) -> None:
        self.cached.pop(seq.uid, None)
        self.written.pop(seq.uid, None)
        self.runner.release(seq)

    def reset(self) -> None:
        self.cached.clear()
        self.written.clear()
        self.runner.reset()


class Speculator:
    """Plans each step's guesses and verifies them against the target's logits (see the module docstring)."""

    def __init__(self, torch: Any, options: SpeculativeOptions, runner: Any, draft: DraftProposer | None = None):
        self.torch = torch
        self.options = options
        self.runner = runner
        self.draft = draft
        self.cost = measure_cost(runner, torch)
        self.tracks: dict[int, _Track] = {}
        self.proposed = 0
        self.accepted = 0

    @property
    def method(self) -> str:
        return "draft" if self.draft is not None else "ngram"

    def plan(self, decode: Sequence[Chunk]) -> dict[int, Proposal]:
        """Guesses for this step's one-token decode chunks; sequences without any decode plainly."""
        wanted = []
        for chunk in decode:
            seq = chunk.seq
            # A penalized or constrained row (its grammar would have to vet every guess), or one with the other
            # fields of ``select_tokens`` (bias, min-p, top log probabilities), samples as usual.
            sampling = seq.request.sampling
            if sampling.repetition_penalty != 1.0 or sampling.extras() or seq.request.constraint is not None:
                continue
            if seq.speculation is None:
                seq.speculation = (0, 0)
            cap = min(self.options.length, seq.max_new_tokens - len(seq.generated) - 1,
                      self.runner.max_position - seq.length + 1)
            k = self.tracks.setdefault(seq.uid, _Track()).wanted(cap) if cap > 0 else 0
            if k > 0:
                wanted.append((seq, k))
        if not wanted:
            return {}
        if self.draft is None:
            proposals = {seq.uid: Proposal(ngram_proposal(seq.all_ids, k, self.options.lookup_max,
                                                          self.options.lookup_min)) for seq, k in wanted}
            wanted = [(seq, len(proposals[seq.uid].tokens)) for seq, _ in wanted]
        limit = self._worthwhile(wanted, len(decode))
        if limit:
            wanted = [(seq, min(k, limit)) for seq, k in wanted if k > 0]
        else:
            wanted = [(seq, k) for seq, k in wanted if k > 0 and self.tracks[seq.uid].exploring()]
        if self.draft is not None:
            proposals = self.draft.propose(wanted)
        out = {}
        for seq, k in wanted:
            proposal = proposals.get(seq.uid)
            if proposal is None:
                continue
            del proposal.tokens[k:]
            room = self._target_room(seq, len(proposal.tokens))
            if room < len(proposal.tokens):
                del proposal.tokens[room:]
            if proposal.tokens:
                if proposal.q is not None:
                    proposal.q = proposal.q[:len(proposal.tokens)]
                out[seq.uid] = proposal
        return out

    def _worthwhile(self, wanted: Sequence[tuple[SequenceState, int]], rows: int) -> int:
        """The cap on guesses per row that maximizes expected tokens per second this step (0: plain decoding)."""
        best, best_rate = 0, rows / self.cost(rows)
        for limit in range(1, max(k for _, k in wanted) + 1):
            caps = [min(k, limit) for _, k in wanted]
            tokens = rows - len(wanted) + sum(expected_tokens(self.tracks[seq.uid].estimate, c)
                                              for (seq, _), c in zip(wanted, caps))
            seconds = self.cost(rows * (max(caps) + 1))  # the decode rows are padded to the widest
            if self.draft is not None:
                seconds += self.draft.step_cost(len(wanted), max(caps))
            if tokens / seconds > best_rate:
                best, best_rate = limit, tokens / seconds
        return best

    def _target_room(self, seq: SequenceState, k: int) -> int:
        """Guesses the target's pool has slots for (verification writes ``k`` more keys)."""
        blocks = self.runner.blocks
        blocks.grow(seq, seq.length + k)
        return min(k, len(blocks.table(seq)) * blocks.block_size - seq.length)

    def verify(self, seq: SequenceState, logits: Any, proposal: Proposal) -> list[tuple[int, float]]:
        """The tokens to emit, from the target's logits at the ``k + 1`` verified positions (``[k + 1, vocab]``)."""
        logits = logits.float()
        guesses = proposal.tokens
        if seq.request.sampling.do_sample:
            emitted = self._rejection_sample(seq, logits, proposal)
        else:
            best = logits.argmax(dim=-1).tolist()
            emitted = []
            for position, token in enumerate(best):
                emitted.append(token)
                if position == len(guesses) or token != guesses[position]:
                    break
        accepted = len(emitted) - 1
        log_probs = self.torch.log_softmax(logits[:len(emitted)], dim=-1)
        picks = [(token, float(log_probs[i, token])) for i, token in enumerate(emitted)]
        self._count(seq, len(guesses), accepted)
        return picks

    def _rejection_sample(self, seq: SequenceState, logits: Any, proposal: Proposal) -> list[int]:
        torch = self.torch
        p = distribution(torch, logits, seq)
        q = proposal.q
        if q is not None and q.shape[-1] != p.shape[-1]:  # a draft with a padded or trimmed embedding table
            width = p.shape[-1]
            q = torch.nn.functional.pad(q[:, :width], (0, max(width - q.shape[-1], 0)))
        emitted = []
        for position, token in enumerate(proposal.tokens):
            q_token = 1.0 if q is None else float(q[position, token])
            if uniform(torch, seq, p.device) * q_token < float(p[position, token]):
                emitted.append(token)
                continue
            if q is None:
                residual = p[position].clone()
                residual[token] = 0.0
            else:
                residual = (p[position] - q[position]).clamp(min=0.0)
            emitted.append(draw(torch, residual, seq))
            return emitted
        emitted.append(draw(torch, p[len(proposal.tokens)], seq))
        return emitted

    def _count(self, seq: SequenceState, proposed: int, accepted: int) -> None:
        self.tracks[seq.uid].update(proposed, accepted)
        drafted, kept = seq.speculation or (0, 0)
        seq.speculation = (drafted + proposed, kept + accepted)
        self.proposed += proposed
        self.accepted += accepted
        if self.draft is not None:
            self.draft.verified(seq, seq.length, accepted)

    def release(self, seq: SequenceState) -> None:
        self.tracks.pop(seq.uid, None)
        if self.draft is not None:
            self.draft.release(seq)

    def reset(self) -> None:
        self.tracks.clear()
        if self.draft is not None:
            self.draft.reset()

    def stats(self) -> dict[str, Any]:
        return {"spec_method": self.method, "spec_draft_tokens": self.proposed, "spec_accepted_tokens": self.accepted,
                "spec_acceptance_rate": round(self.accepted / self.proposed, 4) if self.proposed else 0.0}
