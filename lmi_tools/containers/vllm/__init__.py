"""AWS's vLLM container: ``environment.py`` (serving.properties as its ``SM_VLLM_*`` variables, its entrypoint's
arguments, vLLM's own parser), ``images.py`` (its image URIs), ``launch.py`` (the local server and the ``docker run``
line), ``checks.py`` (``lmi validate`` and ``lmi package`` for it). The handler it runs is
``lmi_handlers/vllm_container/``."""
