"""Structured output and tool calling: what a request constrains its answer to, and how that is enforced.

``constraint``: the one typed ``Constraint`` every wire shape maps to (OpenAI ``response_format``, TGI
``grammar``, LMI's ``guided_*`` parameters), checked by compiling it before anything runs. ``tools``: OpenAI
tool calling (the grammar of a forced call, the parsers of a free one). ``masks``: the per-row token masks the
hf engine applies in its sampler. ``vllm``: the same constraint as vLLM's structured-output parameters.
The grammar library (llguidance) is imported lazily.
"""
