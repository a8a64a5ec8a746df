"""A request's constraint as vLLM's structured-output parameters, for the vLLM engine.

``structured_outputs`` is pure (keyword arguments of ``vllm.sampling_params.StructuredOutputsParams``, no vLLM
import); ``structured_outputs_params`` builds the object. A forced tool call's grammar is the request's
constraint too, so both reach vLLM through these. JSON stays compact unless the request asked for whitespace,
as on the hf engine.
"""

from __future__ import annotations

import json
from typing import Any

from .constraint import Constraint


def structured_outputs(constraint: Constraint | None) -> dict[str, Any] | None:
    """Keyword arguments of ``StructuredOutputsParams`` for ``constraint``; None when there is none."""
    if constraint is None:
        return None
    if constraint.kind == "regex":
        return {"regex": constraint.spec}
    if constraint.kind == "choice":
        return {"choice": json.loads(constraint.spec)}
    spacing: dict[str, Any] = ({"disable_any_whitespace": True} if constraint.whitespace is None
                               else {"whitespace_pattern": constraint.whitespace})
    if constraint.any_object:
        return {"json_object": True, **spacing}
    return {"json": json.loads(constraint.spec), **spacing}


def structured_outputs_params(constraint: Constraint | None) -> Any:
    """``vllm.sampling_params.StructuredOutputsParams`` for ``constraint`` (None when there is none)."""
    kwargs = structured_outputs(constraint)
    if kwargs is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**kwargs)
