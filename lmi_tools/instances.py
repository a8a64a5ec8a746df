"""The instance table: what an instance type is, for validation, ``docker run``, cost figures and deploys.

Two levels, one source. Families (``inf2``, ``g5``...) say which accelerator and so which LMI image an
instance needs, and whether it has local NVMe storage; every SageMaker instance type of a known family
can be deployed (``HostingInstance``). Sizes we have figures for (``INSTANCES``) add chips, cores,
memory, TP degrees and prices for validation and cost.

Sources: ``reference/neuron.md`` section 4 (Neuron: inf2/trn1 architecture pages and price CSVs; GPU:
AWS Batch GPU table, prices from secondary sources - re-check before publishing them). Each
Inferentia2/Trainium chip is one ``/dev/neuronN`` device with 2 NeuronCores and 32 GiB of HBM (16 GiB
per core). SageMaker names carry an ``ml.`` prefix; ``lookup`` accepts both spellings.

The volume rule comes from reading, not from a call to AWS (reference/sagemaker.md §2.2): the
``ProductionVariant.VolumeSizeInGB`` field sizes an EBS gp2 volume; SageMaker's storage docs say instance
families with local NVMe instance storage (ml.g4dn, ml.g5, ml.p4d, ...) use that storage and get no gp2
volume, so we never send the field for them and only set it on EBS-only families (ml.inf2, ml.m5, ml.c5...).
The NVMe families listed here follow EC2's instance-store tables; none of this was checked against the real
CreateEndpointConfig API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UsageError

GIB = 1024**3
NEURON_FAMILIES = frozenset({"inf2", "trn1", "trn1n", "trn2"})
GPU_FAMILIES = frozenset({"g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en"})
# Local NVMe without a "d" in the family name; families such as g4dn, p4d, m5d or c6id have one.
NVME_WITHOUT_D = frozenset({"g5", "g6", "g6e", "gr6", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2"})
SAGEMAKER_TYPE = re.compile(r"ml\.(?P<family>[a-z]+\d+[a-z-]*)\.(?P<size>[a-z0-9-]+)")


def kind_of(family: str) -> str:
    """``neuron`` (inf2/trn: the djl-neuronx image) or ``gpu`` (the djl-lmi image)."""
    return "neuron" if family in NEURON_FAMILIES else "gpu"


@dataclass(frozen=True)
class Instance:
    """An instance size we have figures for."""

    name: str
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
    def family(self) -> str:
        return self.name.split(".")[0]

    @property
    def kind(self) -> str:
        return kind_of(self.family)

    @property
    def devices(self) -> list[str]:
        return [f"/dev/neuron{i}" for i in range(self.chips)] if self.kind == "neuron" else []

    @property
    def cores_per_chip(self) -> int:
        return self.cores // self.chips


# Documented Inf2 topologies: {1, 2, 4, 8, 24}, limited by the cores each size has.
INSTANCES = {i.name: i for i in [
    Instance("inf2.xlarge", 1, 2, 16, 4, 16, (1, 2), 0.758),
    Instance("inf2.8xlarge", 1, 2, 16, 32, 128, (1, 2), 1.97),
    Instance("inf2.24xlarge", 6, 12, 16, 96, 384, (1, 2, 4, 8), 6.49),
    Instance("inf2.48xlarge", 12, 24, 16, 192, 768, (1, 2, 4, 8, 24), 12.981),
    Instance("trn1.2xlarge", 1, 2, 16, 8, 32, (1, 2), 1.34),
    Instance("trn1.32xlarge", 16, 32, 16, 128, 512, (1, 2, 8, 16, 32), 21.50),
    Instance("g5.xlarge", 1, 1, 24, 4, 16, (1,), 1.006, "A10G"),
    Instance("g5.2xlarge", 1, 1, 24, 8, 32, (1,), 1.212, "A10G"),
    Instance("g5.4xlarge", 1, 1, 24, 16, 64, (1,), None, "A10G"),
    Instance("g5.8xlarge", 1, 1, 24, 32, 128, (1,), None, "A10G"),
    Instance("g5.12xlarge", 4, 4, 24, 48, 192, (1, 2, 4), 5.672, "A10G"),
    Instance("g5.16xlarge", 1, 1, 24, 64, 256, (1,), None, "A10G"),
    Instance("g5.24xlarge", 4, 4, 24, 96, 384, (1, 2, 4), None, "A10G"),
    Instance("g5.48xlarge", 8, 8, 24, 192, 768, (1, 2, 4, 8), 16.288, "A10G"),
    Instance("p4d.24xlarge", 8, 8, 40, 96, 1152, (1, 2, 4, 8), None, "A100"),
]}


def lookup(name: str) -> Instance:
    """The instance called ``name`` (``ml.`` prefix allowed); a ``UsageError`` lists the known ones."""
    key = name.removeprefix("ml.")
    if key not in INSTANCES:
        raise UsageError(f"unknown instance type {name!r}",
                         hint=f"known instance types: {', '.join(sorted(INSTANCES))}")
    return INSTANCES[key]


@dataclass(frozen=True)
class HostingInstance:
    """A SageMaker instance type such as ``ml.inf2.48xlarge``, of any size of a known family."""

    name: str
    family: str

    @classmethod
    def parse(cls, name: str) -> HostingInstance:
        match = SAGEMAKER_TYPE.fullmatch(name)
        if match is None:
            raise UsageError(f"--instance {name!r} is not a SageMaker instance type (ml.<family>.<size>)",
                             hint="write it as SageMaker does, with the ml. prefix: ml.inf2.48xlarge, ml.g5.12xlarge")
        family = match.group("family")
        if family not in NEURON_FAMILIES | GPU_FAMILIES:
            raise UsageError(f"--instance {name}: no LMI image is known for the {family} family",
                             hint=f"use a Neuron ({', '.join(sorted(NEURON_FAMILIES))}) or NVIDIA GPU "
                                  f"({', '.join(sorted(GPU_FAMILIES))}) instance, or pass --image")
        return cls(name, family)

    @classmethod
    def parse_any(cls, name: str) -> HostingInstance:
        """Like ``parse`` but accepting any well-formed type (used with an explicit --image)."""
        match = SAGEMAKER_TYPE.fullmatch(name)
        return cls(name, match.group("family")) if match else cls.parse(name)  # parse raises the usage error

    @property
    def kind(self) -> str:
        return kind_of(self.family)

    @property
    def has_local_nvme(self) -> bool:
        generation_suffix = re.sub(r"^[a-z]+\d+", "", self.family)
        return "d" in generation_suffix or self.family in NVME_WITHOUT_D

    @property
    def accepts_volume_size(self) -> bool:
        """Whether ``VolumeSizeInGB`` may be set: EBS-only families only (see the module docstring)."""
        return not self.has_local_nvme
