"""A CPU stand-in for ``transformers_neuronx`` (0.11, the release in the LMI 0.29 neuronx image).

For tests only: it lets the neuronx backend run end to end where no Inferentia2 exists. It has the
library's public names and signatures and raises where the library raises for shapes and options
(compiled batch sizes, ``n_positions`` and ``context_length_estimate`` buckets, unknown keyword
arguments, continuous batching only for Llama and Mistral, no quantization or serialization for
GPT-J/GPT-NeoX, ...). Underneath, a transformers model computes the logits on CPU over the tokens
each KV-cache position holds (see ``base.py``).

What it cannot tell you: whether the Neuron compiler accepts a configuration, how long compiling
takes, real fp16/bf16 numerics on NeuronCores, whether weights and KV cache fit device memory, and
any performance figure. ``save``/``load`` write and read placeholder files named like real
artifacts (one per graph, by content hash), so reuse and mismatch behave like the library's.
"""

from .version import __version__, IS_STANDIN
from .constants import GQA, Layout
from .config import NeuronConfig, QuantizationConfig, ContinuousBatchingConfig, GenerationConfig
from .models import (BloomForSampling, GPT2ForSamplingWithContextBroadcasting, GPTJForSampling,
                     GPTNeoXForSampling, LlamaForSampling, MistralForSampling, MixtralForSampling, OPTForSampling)
from .modeling_auto import NeuronAutoModelForCausalLM

__all__ = ["GQA", "Layout", "NeuronConfig", "QuantizationConfig", "ContinuousBatchingConfig", "GenerationConfig",
           "BloomForSampling", "GPT2ForSamplingWithContextBroadcasting", "GPTJForSampling", "GPTNeoXForSampling",
           "LlamaForSampling", "MistralForSampling", "MixtralForSampling", "OPTForSampling",
           "NeuronAutoModelForCausalLM", "IS_STANDIN", "__version__"]
