"""Per-row token masks for constrained sequences, for a backend that samples with ``backends/sampler.py``.

Each constrained sequence (``request.constraint``) gets one llguidance matcher, compiled when its request is
admitted (``admission.py``: within the grammar budgets, off the step loop) and kept on ``seq.grammar``. Before
sampling, the rows of a step that have one are masked (tokens the grammar forbids get -inf); rows without one are
not touched, so a step mixes constrained and free rows, and different grammars, and a greedy free row is bit for bit
what it is without this module. After sampling, each matcher consumes its row's token; when the grammar can take
nothing more, the end-of-sequence token is appended in the same step, so the answer ends as soon as it is complete.

Each row's grammar works alone (``backends/rows.py``): a grammar that fails in the middle of a generation (its mask
runs out of fuel, it refuses the token) ends its own sequence with a 400 naming its field, and the other rows of the
step are masked and sampled as without it.

Masks are computed while the step waits, not overlapped with the forward: docs/serving.md gives the figures
(a 16-row mask is a small fraction of a decode step). The tokenizer is converted for the grammar library once,
at the first constrained request.
"""

from __future__ import annotations

from typing import Any, Collection

from ..backends.rows import Rows
from ..errors import InvalidRequest
from ..sequence import SequenceState
from .admission import GrammarBudget, GrammarCompiler, refusal


class GrammarMasks(GrammarCompiler):
    """The grammar side of one model's sampling: ``compile`` at admission, ``mask`` before choosing, ``advance``
    after."""

    def __init__(self, hf_tokenizer: Any, eos_ids: Collection[int], vocab: int,
                 budget: GrammarBudget = GrammarBudget()):
        super().__init__(hf_tokenizer, vocab, min(eos_ids) if eos_ids else None, budget)

    def _matcher(self, seq: SequenceState) -> Any:
        if seq.grammar is None:  # a sequence that skipped admission (a backend driven directly)
            seq.grammar = self.compile(seq.request.constraint)
        return seq.grammar

    def mask(self, torch: Any, logits: Any, rows: Rows) -> Any:
        """``logits`` ([rows, vocab], float) with each constrained row's forbidden tokens at -inf (in place); a row
        whose grammar fails leaves ``rows``."""
        import numpy as np

        seqs = rows.seqs
        constrained = [row for row in rows.live if seqs[row].request.constraint is not None]
        if not constrained:
            return logits
        vocab = logits.shape[-1]
        words = (vocab + 31) // 32
        bitmask = np.zeros((len(constrained), words), dtype=np.int32)
        slot = {row: k for k, row in enumerate(constrained)}

        def compute(row: int) -> None:
            matcher = self._matcher(seqs[row])
            matcher.unsafe_compute_mask_ptr(bitmask[slot[row]].ctypes.data, words * 4)
            _check(seqs[row], matcher)

        rows.each("grammar", lambda row: compute(row) if row in slot else None)
        masked = [k for k, row in enumerate(constrained) if row not in rows.failed]
        if not masked:
            return logits
        # numpy's unpackbits: 15-20x faster than shifting the int32 words in torch on 16 rows of 49,152 tokens.
        bits = np.unpackbits(bitmask[masked].view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        forbidden = torch.from_numpy(bits.view(np.bool_)).logical_not().to(logits.device)
        if len(masked) == logits.shape[0]:
            return logits.masked_fill_(forbidden, float("-inf"))
        index = torch.tensor([constrained[k] for k in masked], device=logits.device)
        logits[index] = logits[index].masked_fill_(forbidden, float("-inf"))
        return logits

    def advance(self, rows: Rows, picks: dict[int, Any]) -> dict[int, Any]:
        """Each constrained row's matcher consumes its token; a row whose grammar is complete also gets the
        end-of-sequence token (probability one: nothing else is allowed)."""
        out = dict(picks)

        def consume(row: int) -> None:
            seq, matcher = rows.seqs[row], rows.seqs[row].grammar
            token = picks[row][0]
            if matcher is None or token == self.eos or matcher.is_stopped():
                return
            if not matcher.consume_token(token):
                _check(seq, matcher)
                raise InvalidRequest(f"{seq.request.constraint.field}: the grammar refused the token it allowed",
                                     field=seq.request.constraint.field)
            if matcher.is_stopped() and self.eos is not None and not seq.request.stopping.ignore_eos:
                out[row] = [picks[row], (self.eos, 0.0)]

        rows.each("grammar", lambda row: consume(row) if row in picks else None)
        return out


def _check(seq: SequenceState, matcher: Any) -> None:
    """A 400 naming the request's field when its grammar failed (out of fuel for this step, a dead end)."""
    if matcher.is_error():
        field = seq.request.constraint.field
        raise InvalidRequest(f"{field}: the grammar failed while generating: {refusal(matcher.get_error())}",
                             field=field)
