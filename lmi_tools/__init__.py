"""lmi_tools: the user-side tooling (the ``lmi`` command) around ``lmi_handlers``."""

__version__ = "0.1.0"
