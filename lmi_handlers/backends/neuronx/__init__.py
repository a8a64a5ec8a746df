"""The ``neuronx`` backend: transformers-neuronx on Inferentia2 (``backend.py``), its options and compile plan
(``options.py``), compiled-artifact cache (``artifacts.py``) and continuous-batching runners (``runners.py``)."""
