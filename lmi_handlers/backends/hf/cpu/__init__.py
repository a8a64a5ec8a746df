"""CPU kernels of the ``hf`` backend: the compiled linear and decode-attention kernels (C++ built at load),
oneDNN's prepacked linear, and the process's memory settings."""
