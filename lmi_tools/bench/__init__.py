"""``lmi bench``: load tests for LLM endpoints.

The pieces, in the order a run uses them: ``targets`` (what TARGET and ``--api`` mean), ``prompts`` (a prompt
of N tokens), ``apis`` (request bodies and reading answers, sans-IO), ``wire`` (lines and server-sent events out
of bytes), ``clients`` (aiohttp and boto3 executors), ``loadgen`` (the closed loop), ``records`` (the
per-request log), ``metrics`` (pure functions over that log), ``report`` and ``plots`` (JSON, Markdown, PNG),
``runner`` (a sweep end to end), ``selftest`` with ``trivial_server`` (the load generator's own ceiling).
"""
