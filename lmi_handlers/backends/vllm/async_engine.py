"""vLLM's async engine driven one sequence at a time, producing our events.

Each sequence is one ``generate`` call on an engine client (vLLM's ``AsyncLLM``, or any object with its
``generate(prompt, sampling_params, request_id, lora_request=..., priority=..., trace_headers=...)``, such as the
engine client of a running vLLM server), run as a task of the event loop; vLLM batches whatever is in flight. A
request's priority and trace context go to vLLM as on the step loop (vLLM schedules and traces by its own engine
arguments). Every token still goes through the sequence's ``SequenceState`` (``sampling.append_output``), so stop
sequences, events and bytes are the same as on the step loop of DJL's sync mode. Cancelling a sequence cancels its
task, and leaving ``generate`` aborts the request in vLLM (so does a stop sequence our side sees first).

The surface (``submit``, ``cancel``, ``call``, ``stats``) is the one ``engine_thread.EngineThread`` offers our engine;
nothing here knows DJL. A client whose engine died fails every sequence in flight and later ones with a 503, and
this process exits a moment later (as vLLM's own server does) so that the server starts a fresh worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable, Sequence

from ...errors import EngineStopped
from ...events import Event
from ...sequence import SequenceState
from .adapters import vllm_lora_request
from .sampling import append_output, check_request, vllm_request
from .stats import engine_stats
from .structured import structured_outputs_params
from .watch import EngineWatch, engine_dead, request_error

logger = logging.getLogger(__name__)

Deliver = Callable[[dict[int, list[Event]]], None]


class AsyncVllmEngine(EngineWatch):
    """``client`` (vLLM's ``AsyncLLM``) for ``backend``'s sequences (its tokenizer's EOS ids, vocabulary size and
    ``seeds_stop_engine``); runs on the event loop that calls it."""

    def __init__(self, backend: Any, client: Any):
        self.backend = backend
        self.client = client
        self.tasks: dict[int, tuple[asyncio.Task, SequenceState, Deliver]] = {}
        super().__init__()

    def submit(self, seqs: Sequence[SequenceState], deliver: Deliver) -> None:
        """Start ``seqs``; their events reach ``deliver`` until each has its terminal event."""
        for seq in seqs:
            if self.stopped is not None:
                deliver({seq.uid: [seq.fail(EngineStopped.status, self.stopped)]})
                continue
            task = asyncio.get_running_loop().create_task(self._generate(seq, deliver), name=f"vllm-{seq.uid}")
            self.tasks[seq.uid] = (task, seq, deliver)

    def cancel(self, seqs: Sequence[SequenceState]) -> None:
        """Stop ``seqs`` (their client went away): vLLM aborts them and frees their KV blocks."""
        for seq in seqs:
            entry = self.tasks.pop(seq.uid, None)
            if entry is not None:
                entry[0].cancel()

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` (an adapter's registration: vLLM loads adapters as requests name them)."""
        return function(*args)

    def stats(self) -> dict[str, int | float | str]:
        """vLLM's own numbers (``stats.py``), as the step loop reports them."""
        return engine_stats(self.backend.vllm_stats, sum(not seq.finished for _, seq, _ in self.tasks.values()))

    async def _generate(self, seq: SequenceState, deliver: Deliver) -> None:
        try:
            check_request(seq, self.backend)
            request = vllm_request(seq, self.backend.tokenizer.eos_ids,
                                   structured_outputs=structured_outputs_params(seq.request.constraint),
                                   lora_request=vllm_lora_request(seq.adapter))
            outputs = self.client.generate(request.prompt, request.params, str(seq.uid),
                                           lora_request=request.lora_request, priority=seq.request.priority,
                                           trace_headers=seq.trace_headers)
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    events = append_output(seq, output)
                    if events:
                        deliver({seq.uid: events})
                    if seq.finished and not output.finished:
                        return  # our side stopped it first (a stop sequence): leaving aborts it in vLLM
            if not seq.finished:
                deliver({seq.uid: [seq.fail(500, "vLLM ended the request before it finished")]})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a request vLLM refuses fails alone
            if engine_dead(exc) or getattr(self.client, "errored", False):
                self._stop(exc)
            deliver({seq.uid: [seq.fail(*request_error(exc, self.stopped))]})
        finally:
            self.tasks.pop(seq.uid, None)

    def _stop(self, exc: BaseException) -> None:
        """vLLM's engine stopped: every request in flight fails with a 503 saying so, and this process exits soon."""
        if self.stopped is not None:
            return
        logger.error("vllm: the engine stopped (%s: %s) with %d sequences running; its own error is above. This "
                     "worker exits soon so that the server starts a fresh one", type(exc).__name__, exc,
                     len(self.tasks))
        self.stopped = (f"vLLM's engine stopped ({type(exc).__name__}); the model's worker restarts, the cause is in "
                        "the server log")
        self.exit_soon()
        for uid, (task, seq, deliver) in list(self.tasks.items()):
            if task is not asyncio.current_task():
                self.tasks.pop(uid)
                task.cancel()
                deliver({uid: [seq.fail(EngineStopped.status, self.stopped)]})
