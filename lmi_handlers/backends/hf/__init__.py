"""The ``hf`` backend: transformers models on CPU or CUDA, run by our paged-KV engine (``backend.py``).

Its parts: the tokenizer surface, the paged KV pool and prefix blocks, packed attention, the output projection,
weight quantization, speculative decoding, and the compiled CPU kernels (``cpu/``).
"""
