"""``djl_python.inputs``: the stand-in ``Input``."""

from lmi_handlers.protocol import Input, PairList

__all__ = ["Input", "PairList"]
