"""Per-row token masks for constrained sequences, for a backend that samples with ``backends/sampler.py``.

Each constrained sequence (``request.constraint``) gets one llguidance matcher, created at its first step and
kept on ``seq.grammar``. Before sampling, the rows of a step that have one are masked (tokens the grammar
forbids get -inf); rows without one are not touched, so a step mixes constrained and free rows, and different
grammars, and a greedy free row is bit for bit what it is without this module. After sampling, each matcher
consumes its row's token; when the grammar can take nothing more, the end-of-sequence token is appended in the
same step, so the answer ends as soon as it is complete.

Masks are computed while the step waits, not overlapped with the forward: docs/serving.md gives the figures
(a 16-row mask is a small fraction of a decode step). The tokenizer is converted for the grammar library once,
at the first constrained request.
"""

from __future__ import annotations

import threading
from typing import Any, Collection, Sequence

from ..errors import InvalidRequest
from ..sequence import SequenceState
from .constraint import INSTALL


class GrammarMasks:
    """The grammar side of one model's sampling: ``mask`` before choosing, ``advance`` after."""

    def __init__(self, hf_tokenizer: Any, eos_ids: Collection[int]):
        self._hf = hf_tokenizer
        self._eos = min(eos_ids) if eos_ids else None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _lltokenizer(self, vocab: int) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError:
                    raise InvalidRequest(f"structured output needs the llguidance package on this server ({INSTALL})")
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=vocab, eos_token=self._eos)
            return self._tokenizer

    def _matcher(self, seq: SequenceState, vocab: int) -> Any:
        if seq.grammar is None:
            import llguidance

            seq.grammar = llguidance.LLMatcher(self._lltokenizer(vocab), seq.request.constraint.grammar(),
                                               log_level=0)
            if seq.grammar.is_error():
                raise InvalidRequest(f"{seq.request.constraint.field}: {seq.grammar.get_error()}")
        return seq.grammar

    def mask(self, torch: Any, logits: Any, seqs: Sequence[SequenceState]) -> Any:
        """``logits`` ([rows, vocab], float) with each constrained row's forbidden tokens at -inf (in place)."""
        import numpy as np

        rows = [i for i, seq in enumerate(seqs) if seq.request.constraint is not None]
        if not rows:
            return logits
        vocab = logits.shape[-1]
        words = (vocab + 31) // 32
        bitmask = np.zeros((len(rows), words), dtype=np.int32)
        for k, row in enumerate(rows):
            self._matcher(seqs[row], vocab).unsafe_compute_mask_ptr(bitmask[k].ctypes.data, words * 4)
        # numpy's unpackbits: 15-20x faster than shifting the int32 words in torch on 16 rows of 49,152 tokens.
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        forbidden = torch.from_numpy(bits.view(np.bool_)).logical_not().to(logits.device)
        if len(rows) == logits.shape[0]:
            return logits.masked_fill_(forbidden, float("-inf"))
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill_(forbidden, float("-inf"))
        return logits

    def advance(self, seqs: Sequence[SequenceState],
                picks: list[tuple[int, float]]) -> list[tuple[int, float] | list[tuple[int, float]]]:
        """Each constrained row's matcher consumes its token; a row whose grammar is complete also gets the
        end-of-sequence token (probability one: nothing else is allowed)."""
        out: list[tuple[int, float] | list[tuple[int, float]]] = list(picks)
        for row, seq in enumerate(seqs):
            matcher = seq.grammar
            if matcher is None:
                continue
            token = picks[row][0]
            if token == self._eos or matcher.is_stopped():
                continue
            if not matcher.consume_token(token):
                raise RuntimeError(f"the grammar refused token {token}: {matcher.get_error()}")
            if matcher.is_stopped() and self._eos is not None and not seq.request.stopping.ignore_eos:
                out[row] = [picks[row], (self._eos, 0.0)]
        return out
