"""Instance facts used by validation, ``docker run`` and cost figures.

Source: ``reference/neuron.md`` section 4 (Neuron: inf2/trn1 architecture pages and price CSVs;
GPU: AWS Batch GPU table, prices from secondary sources - re-check before publishing them).
Each Inferentia2/Trainium chip is one ``/dev/neuronN`` device with 2 NeuronCores and 32 GiB of HBM
(16 GiB per core). SageMaker names carry an ``ml.`` prefix; ``lookup`` accepts both spellings.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError

GIB = 1024**3


@dataclass(frozen=True)
class Instance:
    name: str
    #: "neuron" (inf2/trn1) or "gpu".
    kind: str
    #: Accelerator chips: Neuron devices (/dev/neuronN) or GPUs.
    chips: int
    #: NeuronCores (2 per Neuron chip) or GPUs: the units tensor parallelism shards over.
    cores: int
    #: Accelerator memory per core / per GPU, in GiB.
    memory_per_core_gib: int
    vcpus: int
    host_memory_gib: int
    #: Tensor-parallel degrees the runtime supports on this instance.
    tp_degrees: tuple[int, ...]
    #: On-demand USD per hour where a citable figure exists (see the module docstring).
    price_per_hour: float | None = None
    gpu: str | None = None

    @property
    def devices(self) -> list[str]:
        return [f"/dev/neuron{i}" for i in range(self.chips)] if self.kind == "neuron" else []

    @property
    def cores_per_chip(self) -> int:
        return self.cores // self.chips


# Documented Inf2 topologies: {1, 2, 4, 8, 24}, limited by the cores each size has.
INSTANCES = {i.name: i for i in [
    Instance("inf2.xlarge", "neuron", 1, 2, 16, 4, 16, (1, 2), 0.758),
    Instance("inf2.8xlarge", "neuron", 1, 2, 16, 32, 128, (1, 2), 1.97),
    Instance("inf2.24xlarge", "neuron", 6, 12, 16, 96, 384, (1, 2, 4, 8), 6.49),
    Instance("inf2.48xlarge", "neuron", 12, 24, 16, 192, 768, (1, 2, 4, 8, 24), 12.981),
    Instance("trn1.2xlarge", "neuron", 1, 2, 16, 8, 32, (1, 2), 1.34),
    Instance("trn1.32xlarge", "neuron", 16, 32, 16, 128, 512, (1, 2, 8, 16, 32), 21.50),
    Instance("g5.xlarge", "gpu", 1, 1, 24, 4, 16, (1,), 1.006, "A10G"),
    Instance("g5.2xlarge", "gpu", 1, 1, 24, 8, 32, (1,), 1.212, "A10G"),
    Instance("g5.4xlarge", "gpu", 1, 1, 24, 16, 64, (1,), None, "A10G"),
    Instance("g5.8xlarge", "gpu", 1, 1, 24, 32, 128, (1,), None, "A10G"),
    Instance("g5.12xlarge", "gpu", 4, 4, 24, 48, 192, (1, 2, 4), 5.672, "A10G"),
    Instance("g5.16xlarge", "gpu", 1, 1, 24, 64, 256, (1,), None, "A10G"),
    Instance("g5.24xlarge", "gpu", 4, 4, 24, 96, 384, (1, 2, 4), None, "A10G"),
    Instance("g5.48xlarge", "gpu", 8, 8, 24, 192, 768, (1, 2, 4, 8), 16.288, "A10G"),
    Instance("p4d.24xlarge", "gpu", 8, 8, 40, 96, 1152, (1, 2, 4, 8), None, "A100"),
]}


def lookup(name: str) -> Instance:
    """The instance called ``name`` (``ml.`` prefix allowed); a ``UsageError`` lists the known ones."""
    key = name.removeprefix("ml.")
    if key not in INSTANCES:
        raise UsageError(f"unknown instance type {name!r}",
                         hint=f"known instance types: {', '.join(sorted(INSTANCES))}")
    return INSTANCES[key]
