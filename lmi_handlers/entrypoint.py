"""The handler module DJLServing loads: ``option.entryPoint=lmi_handlers.entrypoint``.

Or, in a ``model.py`` beside ``serving.properties``::

    from lmi_handlers.entrypoint import handle  # noqa: F401

Importing this module is cheap and has no side effects (DJLServing may import it several times);
the model loads on the first (empty) call.
"""

from __future__ import annotations

from typing import Any

from .handler import Handler

#: The module-level service object; ``djl_python``'s test harness resets ``_service.initialized``.
_service = Handler()


def handle(inputs: Any) -> Any:
    return _service.handle(inputs)


def register_adapter(inputs: Any) -> Any:
    """DJLServing's adapter registration (``handler=register_adapter``; properties ``name``, ``src``)."""
    return _service.manage_adapter(inputs, "register")


def update_adapter(inputs: Any) -> Any:
    return _service.manage_adapter(inputs, "update")


def unregister_adapter(inputs: Any) -> Any:
    return _service.manage_adapter(inputs, "unregister")
