"""One sequence's request to vLLM: its prompt ids, ``SamplingParams`` and adapter, from our typed request.

vLLM chooses the tokens; everything the client sees (incremental text, stop sequences, EOS, the token budget) is
still decided by ``SequenceState``, as on every backend, so the same token ids give the same bytes. vLLM is
therefore asked for token ids only (``detokenize=False``), one delta per step, with the sampled token's log
probability (the encoders print it on every streamed token), and stops by itself only at EOS and the budget.

Structured output and LoRA adapters arrive as ready-made vLLM objects (``structured_outputs`` for
``SamplingParams``, ``lora_request`` for ``add_request``) from whoever maps a request's schema or adapter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Collection

from ...errors import invalid_field, status_of
from ...events import Event, FinishReason
from ...schemas import Schema
from ...sequence import SequenceState

logger = logging.getLogger(__name__)

#: Request fields this backend honours beyond the ones every backend does (``schemas.OFF_VALUES`` names them).
EXTRA_FIELDS = ("min_p", "presence_penalty", "frequency_penalty", "logit_bias", "top_logprobs")


@dataclass(frozen=True)
class VllmRequest:
    prompt: Any
    params: Any
    lora_request: Any = None


def vllm_request(seq: SequenceState, eos_ids: Collection[int], *, structured_outputs: Any = None,
                 lora_request: Any = None) -> VllmRequest:
    """``seq`` as vLLM's ``add_request`` arguments; vLLM stops by itself at ``eos_ids`` (unless ``ignore_eos``)."""
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sampling, stopping = seq.request.sampling, seq.request.stopping
    kwargs: dict[str, Any] = {
        "max_tokens": seq.max_new_tokens, "ignore_eos": stopping.ignore_eos,
        "logprobs": getattr(sampling, "top_logprobs", 0) or 0, "detokenize": False,
        "output_kind": RequestOutputKind.DELTA, "repetition_penalty": sampling.repetition_penalty,
    }
    if not stopping.ignore_eos and eos_ids:
        kwargs["stop_token_ids"] = sorted(eos_ids)
    if sampling.do_sample:
        # Only the client's own seed (plus the choice's index, for n > 1: ``seq.seed``, as vLLM seeds a request's
        # children): vLLM samples unseeded requests from its engine's generator, as its own server does (the seed
        # the handler draws for every other request is for our engine's generators).
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                      seed=seq.seed if sampling.seed is not None else None)
    else:
        kwargs["temperature"] = 0.0
    for name in EXTRA_FIELDS[:3]:
        if getattr(sampling, name, None) is not None:
            kwargs[name] = getattr(sampling, name)
    if getattr(sampling, "logit_bias", None):
        kwargs["logit_bias"] = {int(token): bias for token, bias in sampling.logit_bias}
    if structured_outputs is not None:
        kwargs["structured_outputs"] = structured_outputs
    return VllmRequest(TokensPrompt(prompt_token_ids=list(seq.prompt_ids)), vllm.SamplingParams(**kwargs),
                       lora_request)


def append_output(seq: SequenceState, output: Any) -> list[Event]:
    """Feed one vLLM ``RequestOutput`` delta's tokens through ``seq``: the events due (its last one terminal once
    the sequence finishes, by our rules or at a limit of vLLM's own)."""
    completion = output.outputs[0]
    top_k = seq.request.sampling.top_logprobs or 0
    events: list[Event] = []
    for i, token_id in enumerate(completion.token_ids):
        log_prob, top = _log_probs(completion.logprobs, i, token_id, top_k)
        try:
            events += seq.append(token_id, log_prob, top)
        except Exception as exc:  # noqa: BLE001 - detokenizing one sequence failed: it alone ends
            logger.exception("detokenizing sequence %d failed", seq.uid)
            events.append(seq.fail(status_of(exc), f"generation failed: {type(exc).__name__}: {exc}"))
        if seq.finished:
            break
    if not seq.finished and output.finished:
        # vLLM ended it at a limit of its own (the model length): what was generated is the answer.
        seq.finished = True
        events.append(seq.result(FinishReason.LENGTH))
    return events


def check_request(seq: SequenceState, backend: Any) -> None:
    """What vLLM's engine would not refuse by itself but must be: a seed on vLLM's CPU build with chunked prefill,
    which would stop the engine (``seeds_stop_engine``). (``job.py`` checks ``logit_bias`` ids for every backend.)"""
    seed = seq.request.sampling.seed
    if seed is not None and seq.request.sampling.do_sample and backend.seeds_stop_engine:
        field = "parameters.seed" if seq.request.schema is Schema.LMI else "seed"
        raise invalid_field(field, seed, "vLLM's CPU build stops its engine when it prefills a seeded prompt in "
                            "chunks, so seeds are refused while chunked prefill is on; send no seed, or serve "
                            "with option.enable_chunked_prefill=false")


def _log_probs(logprobs: Any, i: int, token_id: int, top_k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log probability and the ``top_k`` most likely tokens', from vLLM's position ``i``."""
    if not logprobs:
        return 0.0, []
    entries = logprobs[i]
    chosen = entries.get(token_id)
    ranked = sorted((entry.rank, tid, float(entry.logprob)) for tid, entry in entries.items() if entry.rank <= top_k)
    return (float(chosen.logprob) if chosen is not None else 0.0), [(tid, p) for _, tid, p in ranked[:top_k]]
