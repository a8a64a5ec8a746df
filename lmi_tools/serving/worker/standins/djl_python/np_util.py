"""``djl_python.np_util``: DJL's ndlist bytes to and from numpy arrays."""

from lmi_handlers.ndlist import decode as from_nd_list, encode as to_nd_list

__all__ = ["from_nd_list", "to_nd_list"]
