"""The one module that imports ``djl_python``.

Inside an LMI container the Python engine checks ``isinstance(result, djl_python.Output)``, so the
handler must answer with the engine's own class. Elsewhere (tests, ``lmi serve`` workers) the
stand-ins of ``protocol.py`` behave the same. The import is lazy: importing the handler stays
cheap and free of third-party modules.
"""

from __future__ import annotations

from typing import Any

_output_class: Any = None


def output_class() -> Any:
    global _output_class
    if _output_class is None:
        try:
            from djl_python.outputs import Output  # type: ignore[import-not-found]
        except ImportError:
            from .protocol import Output
        _output_class = Output
    return _output_class


def new_output(code: int = 200, message: str = "OK") -> Any:
    return output_class()(code=code, message=message)


def binary_encode(value: dict[str, Any]) -> bytes:
    return output_class().binary_encode(value)


def async_output(data: str, last: bool, content_type: str, error: str | None = None, code: int | None = None) -> Any:
    """One answer of DJL's async engine as ``djl_python.async_utils`` writes it (``_create_output``): the map
    ``{"data": data + "\\n", "last": last}``, then ``error`` and ``code`` where given, binary-encoded as the only
    content item, and the ``Content-Type`` property. Java appends ``data`` to the client's response and ends it at
    ``last``; with ``code`` it answers ``{"code", "error"}`` with that status instead."""
    item: dict[str, Any] = {"data": data + "\n", "last": last}
    if error:
        item["error"] = error
    if code:
        item["code"] = code
    return new_output().add_property("Content-Type", content_type).add(binary_encode(item))


def configuration(inputs: Any) -> dict[str, Any]:
    """The properties to load from. DJLServing's init call carries only the model's; a harness that skips it
    (djl_python's ``TestHandler``) loads from the first request, whose batch layout is no configuration:
    its ``batch_size`` would read as dynamic batching (and be refused with rolling batch)."""
    properties = inputs.get_properties()
    if inputs.is_empty():
        return properties
    return {key: value for key, value in properties.items() if not key.startswith("batch_")}
