"""The containers a model directory can be served in besides LMI's (DJLServing) images.

``vllm/``: AWS's vLLM container (vLLM's own OpenAI server with SageMaker's routes): the directory's
``serving.properties`` as its ``SM_VLLM_*`` environment, its image, its checks, and the local server and
``docker run`` line that start it as its entrypoint does (docs/vllm-container.md).
"""

from __future__ import annotations

#: ``--container`` of validate, package, deploy, docker-run and serve: LMI's images (DJLServing), or AWS's vLLM one.
CONTAINERS = ("lmi", "vllm")


def check_container(name: str) -> str:
    """``name`` if it is one of ``CONTAINERS``, else a ``UsageError`` naming them."""
    from ..errors import UsageError

    if name not in CONTAINERS:
        raise UsageError(f"--container {name!r} is not one of {', '.join(CONTAINERS)}",
                         hint="lmi: LMI's DJLServing images; vllm: AWS's vLLM container (docs/vllm-container.md)")
    return name
