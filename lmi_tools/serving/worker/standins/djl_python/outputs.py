"""``djl_python.outputs``: the stand-in ``Output``."""

from lmi_handlers.protocol import Output, PairList

__all__ = ["Output", "PairList"]
