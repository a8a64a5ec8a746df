"""``djl_python`` for ``lmi serve`` workers: the names a custom ``model.py`` imports, backed by the
stand-ins of ``lmi_handlers.protocol``.

In an LMI container ``djl_python`` is DJLServing's own package. ``lmi serve`` puts this directory's
parent on the worker's ``PYTHONPATH`` only where no real ``djl_python`` is installed, so that
``from djl_python import Input, Output`` (or ``from djl_python.inputs import Input``) runs unchanged.
Here are the request/response classes, the ndlist helpers, and what an async ``model.py`` (``async def handle``,
DJL's async mode) imports: ``async_utils`` and ``encode_decode``. DJL's built-in handlers
(``djl_python.huggingface``...) and its engines are not (docs/djl-compat.md).
"""

from lmi_handlers.protocol import Input, Output, PairList

__all__ = ["Input", "Output", "PairList"]
