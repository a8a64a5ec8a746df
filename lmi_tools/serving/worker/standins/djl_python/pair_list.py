"""``djl_python.pair_list``: the stand-in ``PairList``."""

from lmi_handlers.protocol import PairList

__all__ = ["PairList"]
