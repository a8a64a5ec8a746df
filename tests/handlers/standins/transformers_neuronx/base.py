"""The CPU engine behind every stand-in model class.

What the device's KV cache holds, the stand-in holds as token ids: ``TokenCache`` records which
token was written at each cache position of each batch row, and the logits of a position come
from running the transformers model over the tokens that position may attend to. So a write to
the wrong position, a wrong ``start_ids`` or a missing row changes the output just as it would on
a NeuronCore. Where the hardware would silently read stale memory - a position never written
since the last reset - the stand-in raises instead.
"""

import bisect
import hashlib
import json
import os

import torch

from .config import NeuronConfig
from .version import __version__

AMP_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
#: Graphs "compiled" in this process; tests read it to tell a compile from a reuse of saved artifacts.
COMPILE_COUNTER = {"graphs": 0}


def token_sizes(n_positions):
    """Token-generation buckets: powers of two from 128 up to ``n_positions`` (or the given list)."""
    if isinstance(n_positions, (list, tuple)):
        return sorted(n_positions)
    sizes, size = [], 128
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return sizes + [n_positions]


def context_sizes(estimate, token_buckets):
    """Prefill buckets: the given list or int (0: none), else half of each token bucket."""
    if isinstance(estimate, (list, tuple)):
        return sorted(estimate)
    if isinstance(estimate, int):
        return [] if estimate <= 0 else [estimate]
    if estimate is None:
        return [size // 2 for size in token_buckets]
    raise NotImplementedError(f"Prompt bucket config {estimate} not supported")


def batch_sizes(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, list)):
        raise TypeError("batch_size must be list of ints or int type")
    return [batch_size] if isinstance(batch_size, int) else sorted(batch_size)


def find_bucket(buckets, size):
    """The smallest bucket >= size, or the largest bucket (None without buckets)."""
    if not buckets:
        return None
    return buckets[bisect.bisect_left(buckets, size, hi=len(buckets) - 1)]


def visible_cores():
    """NeuronCores this process may use per the runtime's environment (None: not restricted)."""
    if os.environ.get("NEURON_RT_NUM_CORES"):
        return int(os.environ["NEURON_RT_NUM_CORES"])
    spec = os.environ.get("NEURON_RT_VISIBLE_CORES")
    if not spec:
        return None
    count = 0
    for part in spec.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


class TokenCache:
    """The KV cache of ``rows`` sequences as token ids, with a flag per written position."""

    def __init__(self, rows, n_positions):
        self.tokens = torch.zeros(rows, n_positions, dtype=torch.long)
        self.written = torch.zeros(rows, n_positions, dtype=torch.bool)

    def write(self, row, positions, tokens):
        self.tokens[row, positions] = tokens
        self.written[row, positions] = True

    def clear(self, row=None):
        if row is None:
            self.written[:] = False
        else:
            self.written[row] = False

    def visible(self, row, first, last):
        """Token ids at positions first..last of ``row``; raises if any was never written."""
        seen = self.written[row, first:last + 1]
        if not bool(seen.all()):
            missing = (torch.nonzero(~seen).flatten() + first).tolist()
            raise RuntimeError(f"batch row {row} attends to KV-cache positions {missing[:8]} that were never "
                               "written since the last reset (on a NeuronCore this reads stale memory)")
        return self.tokens[row, first:last + 1]


class CpuCausalLM:
    """Shape checks, compile bookkeeping and the static/continuous-batching forward of all classes."""

    #: Architectures whose attention masks the positions before ``start_ids`` (left padding).
    masks_left_padding = True
    continuous_batching_supported = False
    #: HF ``model_type`` values the class accepts.
    model_types = ()

    # --- construction ---------------------------------------------------------------------------

    def _setup(self, config, *, n_positions, batch_size, amp, tp_degree, context_length_estimate, neuron_config,
               unroll=None):
        self._check_model_type(config)
        if amp not in AMP_DTYPES:
            raise KeyError(f"amp={amp!r} is not one of {sorted(AMP_DTYPES)}")
        if isinstance(tp_degree, bool) or not isinstance(tp_degree, int) or tp_degree < 1:
            raise ValueError(f"tp_degree must be a positive integer, got {tp_degree!r}")
        self.config = config
        self.neuron_config = neuron_config if neuron_config else NeuronConfig()
        self.amp, self.tp_degree = amp, tp_degree
        self.token_buckets = token_sizes(n_positions)
        self.n_positions = self.token_buckets[-1]
        self.context_buckets = context_sizes(context_length_estimate, self.token_buckets)
        self.batch_sizes = batch_sizes(batch_size)
        continuous = self.neuron_config.continuous_batching
        if continuous and not self.continuous_batching_supported:
            raise NotImplementedError(f"continuous batching is not supported by {type(self).__name__}")
        self.context_batch_sizes = [1] if continuous else self.batch_sizes
        if self.context_buckets and max(self.context_buckets) > self.n_positions:
            raise ValueError(f"context_length_estimate {max(self.context_buckets)} exceeds n_positions "
                             f"{self.n_positions}")
        if unroll is not None and config.num_hidden_layers % unroll:
            raise ValueError(f"unroll={unroll} does not divide num_layers={config.num_hidden_layers}")
        self._weights_dir = self._artifacts_dir = None
        self._hf = self._neffs = self._cache = None

    def _check_model_type(self, config):
        if config.model_type not in self.model_types:
            raise ValueError(f"{type(self).__name__} cannot run a {config.model_type!r} model")

    @classmethod
    def from_pretrained(cls, pretrained_model_path, *model_args, **kwargs):
        from transformers import AutoConfig

        _sanity_check(kwargs)
        if not os.path.isdir(pretrained_model_path):
            raise OSError(f"{pretrained_model_path} is not a local directory (the stand-in never downloads)")
        model = cls(AutoConfig.from_pretrained(pretrained_model_path), *model_args, **kwargs)
        names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
        if not any(os.path.exists(os.path.join(pretrained_model_path, name)) for name in names):
            raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {pretrained_model_path}")
        model._weights_dir = pretrained_model_path
        return model

    # --- compile ----------------------------------------------------------------------------------

    def _graphs(self):
        """One descriptor per compiled executable: token buckets x batch sizes, context buckets."""
        graphs = [("token", size, batch) for size in self.token_buckets for batch in self.batch_sizes]
        graphs += [("context", size, batch) for size in self.context_buckets for batch in self.context_batch_sizes]
        model = {k: v for k, v in sorted(self.config.to_dict().items())
                 if isinstance(v, (int, float, str, bool)) and k not in ("_name_or_path", "transformers_version")}
        common = {"class": type(self).__name__, "model": model, "amp": self.amp, "tp": self.tp_degree,
                  "neuron": self.neuron_config.describe(), "version": __version__}
        return {hashlib.sha256(json.dumps({**common, "graph": g}, sort_keys=True).encode()).hexdigest(): g
                for g in graphs}

    def _check_sharding(self):
        cores = visible_cores()
        if cores is not None and self.tp_degree > cores:
            raise RuntimeError(f"tp_degree={self.tp_degree} needs {self.tp_degree} NeuronCores but the runtime "
                               f"environment makes {cores} visible")

    def to_neuron(self):
        """Load the weights and compile every graph, or take them from ``load(directory)``."""
        if self._weights_dir is None:
            raise RuntimeError("no weights to load: build the model with from_pretrained(directory, ...)")
        self._check_sharding()
        graphs = self._graphs()
        if self._artifacts_dir is not None:
            self._neffs = _read_artifacts(self._artifacts_dir, graphs)
        else:
            self._neffs = {key: b"STANDIN-NEFF " + json.dumps(g).encode() for key, g in graphs.items()}
            COMPILE_COUNTER["graphs"] += len(graphs)
        self._hf = _load_hf(self._weights_dir, AMP_DTYPES[self.amp], self.neuron_config.quant)
        continuous = self.neuron_config.continuous_batching
        rows = continuous.batch_size_for_shared_caches if continuous else max(self.batch_sizes)
        self._cache = TokenCache(rows, self.n_positions)

    def reset(self):
        if self._cache is not None:
            self._cache.clear()

    # --- forward ------------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, input_ids, cache_ids=None, start_ids=None):
        """Next-token logits ``[rows, vocab]`` (float32) after writing ``input_ids`` at ``cache_ids``."""
        if self._hf is None:
            raise RuntimeError("call to_neuron() before running the model")
        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        if self.neuron_config.continuous_batching and start_ids is not None:
            return self._forward_continuous(input_ids, cache_ids, torch.as_tensor(start_ids).flatten())
        return self._forward_static(input_ids, cache_ids, start_ids)

    def _forward_static(self, input_ids, cache_ids, start_ids):
        batch, length = input_ids.shape
        if batch not in self.batch_sizes:
            raise ValueError(f"Model not compiled for batch_size : {batch}. Acceptable batch_size is one of "
                             f"the following {self.batch_sizes}")
        cache_ids = torch.arange(length) if cache_ids is None else torch.as_tensor(cache_ids)
        if cache_ids.dim() != 1 or cache_ids.numel() != length:
            raise ValueError(f"static batching takes 1-D cache_ids with one position per input token, got "
                             f"shape {tuple(cache_ids.shape)} for {length} tokens")
        if length > 1 and int(cache_ids[0]) != 0:
            raise NotImplementedError("a multi-token forward that does not start at position 0 needs the "
                                      "speculation graphs (enable_speculative_decoder)")
        self._check_positions(int(cache_ids.max()))
        starts = torch.zeros(batch, dtype=torch.long) if start_ids is None else torch.as_tensor(start_ids).flatten()
        if starts.numel() != batch:
            raise ValueError(f"start_ids has {starts.numel()} entries for a batch of {batch}")
        for row in range(batch):
            self._cache.write(row, cache_ids, input_ids[row])
        last = int(cache_ids[-1])
        firsts = [int(s) if self.masks_left_padding else 0 for s in starts]
        return self._logits([(row, firsts[row], last) for row in range(batch)])

    def _forward_continuous(self, input_ids, cache_ids, seq_ids):
        count, length = input_ids.shape
        slots = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        cache_ids = None if cache_ids is None else torch.as_tensor(cache_ids)
        if cache_ids is None or tuple(cache_ids.shape) != (count, length):
            raise ValueError("continuous batching takes 2-D cache_ids [n_seqs, n_tokens], one row per sequence")
        ids = seq_ids.tolist()
        if len(ids) != count or len(set(ids)) != count or min(ids) < 0 or max(ids) >= slots:
            raise ValueError(f"start_ids must hold {count} distinct slot ids in [0, {slots}), got {ids}")
        if length > 1:
            return self._context_continuous(input_ids, cache_ids, ids)
        positions = cache_ids[:, 0].tolist()
        self._check_positions(max(positions))
        # Every slot takes part in a decode step: the ones not named write token 0 at position 0.
        rows = dict(zip(ids, zip(input_ids[:, 0].tolist(), positions)))
        for slot in range(slots):
            token, position = rows.get(slot, (0, 0))
            self._cache.write(slot, position, token)
        return self._logits([(slot, 0, rows[slot][1]) for slot in ids])

    def _context_continuous(self, input_ids, cache_ids, ids):
        count, length = input_ids.shape
        if int(cache_ids[0, 0]) != 0:
            raise NotImplementedError("a multi-token forward that does not start at position 0 needs the "
                                      "speculation graphs (enable_speculative_decoder)")
        bucket = find_bucket(self.context_buckets, length)
        assert bucket is not None and length <= bucket, f"invalid input prompt length ({length} <= {bucket})"
        requests = []
        for i, slot in enumerate(ids):
            last = int(cache_ids[i].max())
            if not torch.equal(cache_ids[i, :last + 1], torch.arange(last + 1, dtype=cache_ids.dtype)):
                raise ValueError(f"prefill cache_ids of row {i} must count 0, 1, 2, ... (zeros after a right-"
                                 f"padded prompt), got {cache_ids[i].tolist()}")
            self._cache.clear(slot)
            self._cache.write(slot, torch.arange(last + 1), input_ids[i, :last + 1])
            requests.append((slot, 0, last))
        return self._logits(requests)

    def _check_positions(self, highest):
        if highest >= self.n_positions:
            raise ValueError(f"cache position {highest} is beyond the compiled n_positions={self.n_positions}")

    def _logits(self, requests):
        """Logits of the last position of each (row, first visible position, last position)."""
        out = []
        with torch.inference_mode():
            for row, first, last in requests:
                ids = self._cache.visible(row, min(first, last), last)
                out.append(self._hf(input_ids=ids[None]).logits[0, -1])
        logits = torch.stack(out).float()
        return logits.to(getattr(torch, self.neuron_config.cast_logits_dtype))

    # --- host-side sampling loop ------------------------------------------------------------------

    def _check_sample_batch(self, input_ids):
        batch = input_ids.shape[0]
        if batch not in self.batch_sizes:
            raise ValueError(f"Model not compiled for batch_size : {batch}. Acceptable batch_size is one of "
                             f"the following {self.batch_sizes}")


class NeuronModelBase(CpuCausalLM):
    """Classes with compiled-artifact serialization (all but GPT-J and GPT-NeoX)."""

    def save(self, directory):
        if not self._neffs:
            raise AssertionError("cannot save a model which has not been successfully compiled")
        if os.path.isfile(directory):
            raise FileExistsError(f"Artifacts should be saved to a directory. Found existing file: {directory}")
        os.makedirs(directory, exist_ok=True)
        for key, neff in self._neffs.items():
            with open(os.path.join(directory, key), "wb") as f:
                f.write(neff)

    def load(self, directory):
        """Use the artifacts in ``directory`` at the next ``to_neuron()`` instead of compiling."""
        self._artifacts_dir = directory


class PretrainedModel(CpuCausalLM):
    """Classes without serialization: they have no ``save``/``load``."""


def _read_artifacts(directory, graphs):
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Did not find directory: {directory}.")
    neffs = {}
    for key in graphs:
        path = os.path.join(directory, key)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no compiled graph in {directory} matches this model's graph {graphs[key]}: "
                                    "load artifacts saved by a model of the same type and parameters, or compile "
                                    "and save them again")
        with open(path, "rb") as f:
            neffs[key] = f.read()
    return neffs


def _sanity_check(kwargs):
    neuron_config = kwargs.get("neuron_config")
    bsh_cache = neuron_config is not None and neuron_config.cache_layout == "BSH"
    continuous = neuron_config is not None and neuron_config.continuous_batching
    if continuous:
        shared = continuous.batch_size_for_shared_caches
        assert shared == kwargs.get("batch_size"), (
            f"invalid batch_size_for_shared_caches ({shared}), {kwargs.get('batch_size')} is expected")
        if bsh_cache:
            for name in ("n_positions", "context_length_estimate"):
                value = kwargs.get(name)
                assert isinstance(value, list) and len(value) == 1, "BSH cache layout does not support multi-bucketing"
    else:
        assert not bsh_cache, "BSH cache layout can only be configured with continuous batching."


def _load_hf(directory, dtype, quant):
    import transformers
    from transformers import AutoModelForCausalLM

    major = int(transformers.__version__.split(".")[0])
    key = "dtype" if major >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(directory, **{key: dtype}).eval()
    if quant is not None:
        _fake_quantize(model, quant)
    return model


def _fake_quantize(model, quant):
    """Round linear weights to int8 with one scale per output row and back (weight-only s8)."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module is head:
                continue
            if not quant.quantize_attn and ("attn" in name or "attention" in name):
                continue
            weight = module.weight.float()
            scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
            module.weight.copy_((torch.round(weight / scale).clamp(-127, 127) * scale).to(module.weight.dtype))
