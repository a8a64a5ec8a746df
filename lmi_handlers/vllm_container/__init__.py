"""LMI's clients in AWS's vLLM container: the same model directory and the same requests as on DJLServing.

AWS's vLLM container is vLLM's own OpenAI server with SageMaker's ``/ping`` and ``/invocations``
(``vllm/entrypoints/serve/sagemaker/api_router.py``), built with AWS's ``model-hosting-container-standards``
package. Before the server starts, that package loads ``$SAGEMAKER_MODEL_PATH/$CUSTOM_SCRIPT_FILENAME``
(``/opt/ml/model/model.py``), whose ``@custom_invocation_handler`` and ``@custom_ping_handler`` replace vLLM's two
routes. The ``model.py`` that ``lmi render`` writes serves both containers: DJLServing calls its ``handle``; in the
vLLM container it calls ``install``, which registers

- ``/invocations`` (``routes.py``): OpenAI's shapes go to vLLM's own handler unchanged; LMI's shapes (LMI, TGI, the
  original inf2 example) are answered by ``service.py`` in DJLServing's bytes, on the engine vLLM's server runs;
- ``/ping``: the handler's load (``serving.properties`` beside ``model.py``, the tokenizer), then vLLM's own check.
"""

from __future__ import annotations

import sys

#: Imported by vLLM's server before it loads ``model.py``; never by DJLServing.
STANDARDS = "model_hosting_container_standards.sagemaker"


def install(model_dir: str) -> bool:
    """Register LMI's ``/invocations`` and ``/ping`` for the model in ``model_dir`` when this runs inside vLLM's
    server (the standards package is loading ``model.py``); elsewhere (DJLServing) nothing. True when installed."""
    if STANDARDS not in sys.modules:
        return False
    from .routes import register

    register(model_dir)
    return True
