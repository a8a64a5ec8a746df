"""Structured output and tool calling: what a request constrains its answer to, and how that is enforced.

``constraint``: the one typed ``Constraint`` every wire shape maps to (OpenAI ``response_format``, TGI
``grammar``, LMI's ``guided_*`` parameters), checked by compiling it before anything runs. ``tools``: OpenAI
tool calling (the grammar of a forced call, the parsers of a free one). ``masks``: the per-row token masks the
hf engine applies in its sampler. The same constraint as vLLM's structured-output parameters lives with the vllm
backend (``backends/vllm/structured.py``).
The grammar library (llguidance) is imported lazily.
"""
