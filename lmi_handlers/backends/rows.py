"""One sequence's failure inside a shared step stays its own: the rows of a step, and those that failed.

A backend step runs stages over many rows (one per sequence): the forward (each row with its LoRA adapter), the
grammar masks, the sampler, the grammars' advance. ``Rows`` runs each stage over the rows still alive:

* ``each``: a stage that works row by row (a grammar's mask, a random draw); a row whose work raises fails alone;
* ``batched``: a stage that works on all rows at once (the forward, the sampler's tensors). When it raises, nothing
  says which row was at fault, so it runs again one row at a time: the rows that fail alone are the culprits, and
  the others get what they would get alone. When every row fails alone the failure is the step's (the model's, not
  any request's): it is raised, and the engine fails the step as before.

A failed row leaves the rest of the step; the backend answers its ``SequenceFailed`` in place of a token, and the
engine ends that sequence alone with it (``engine.py``). Its neighbours continue unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import SequenceFailed
from ..sequence import SequenceState


class Rows:
    """The rows (sequences) of one stage chain of a step, and the failures of those that left it."""

    def __init__(self, seqs: Sequence[SequenceState]):
        self.seqs = seqs
        #: The failure of each row that left, by row index.
        self.failed: dict[int, SequenceFailed] = {}

    @property
    def live(self) -> list[int]:
        return [row for row in range(len(self.seqs)) if row not in self.failed]

    def fail(self, row: int, stage: str, error: BaseException) -> None:
        self.failed[row] = error if isinstance(error, SequenceFailed) else SequenceFailed(stage, error)

    def each(self, stage: str, work: Callable[[int], Any]) -> dict[int, Any]:
        """``work(row)`` for every live row, by row; a row whose work raises fails alone."""
        out = {}
        for row in self.live:
            try:
                out[row] = work(row)
            except Exception as exc:  # noqa: BLE001 - one row's failure is its own
                self.fail(row, stage, exc)
        return out

    def batched(self, stage: str, work: Callable[[list[int]], Any],
                join: Callable[[list[Any]], Any] = list) -> tuple[list[int], Any]:
        """``(rows, work(rows))`` for the live rows; ``work`` answers one result per row, in order (a list, or a
        tensor's rows). If it raises, each row runs alone: then the rows that succeeded and ``join`` of their
        results. No row left: ``([], None)``."""
        rows = self.live
        if not rows:
            return [], None
        try:
            return rows, work(rows)
        except Exception as exc:  # noqa: BLE001 - whose fault it was is found below
            if len(rows) == 1:
                self.fail(rows[0], stage, exc)
                return [], None
            done, results = [], []
            for row in rows:
                try:
                    results.append(work([row])[0])
                    done.append(row)
                except Exception as alone:  # noqa: BLE001 - the culprit, found
                    self.fail(row, stage, alone)
            if not done:
                for row in rows:
                    del self.failed[row]
                raise exc  # every row fails alone: the step's failure, not one request's
            return done, join(results)

    def by_uid(self) -> dict[int, SequenceFailed]:
        return {self.seqs[row].uid: failure for row, failure in self.failed.items()}

    def answer(self, picks: dict[int, Any]) -> list[Any]:
        """One entry per row: its pick, or its ``SequenceFailed``."""
        return [self.failed[row] if row in self.failed else picks[row] for row in range(len(self.seqs))]
