"""lmi_handlers: text-generation handlers that run unchanged inside DJLServing / AWS LMI containers.

Only the standard library is imported at module level anywhere in this package; torch,
transformers, transformers_neuronx and djl_python are imported where they are used.
"""

__version__ = "0.1.0"
