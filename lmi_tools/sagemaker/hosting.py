"""What a SageMaker hosting instance type implies for a deployment: which LMI image (Neuron or GPU), and
whether the endpoint config may set ``VolumeSizeInGB``.

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

from ..errors import UsageError

INSTANCE_TYPE = re.compile(r"ml\.(?P<family>[a-z]+\d+[a-z-]*)\.(?P<size>[a-z0-9-]+)")
NEURON_FAMILIES = frozenset({"inf2", "trn1", "trn1n", "trn2"})
GPU_FAMILIES = frozenset({"g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en"})
# Local NVMe without a "d" in the family name; families such as g4dn, p4d, m5d or c6id have one.
NVME_WITHOUT_D = frozenset({"g5", "g6", "g6e", "gr6", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2"})


@dataclass(frozen=True)
class HostingInstance:
    """A SageMaker instance type such as ``ml.inf2.48xlarge``, and what it implies."""

    name: str
    family: str

    @classmethod
    def parse(cls, name: str) -> HostingInstance:
        match = INSTANCE_TYPE.fullmatch(name)
        if match is None:
            raise UsageError(f"--instance {name!r} is not a SageMaker instance type (ml.<family>.<size>)",
                             hint="write it as SageMaker does, with the ml. prefix: ml.inf2.48xlarge, ml.g5.12xlarge")
        family = match.group("family")
        if family not in NEURON_FAMILIES | GPU_FAMILIES:
            raise UsageError(f"--instance {name}: no LMI image is known for the {family} family",
                             hint=f"use a Neuron ({', '.join(sorted(NEURON_FAMILIES))}) or NVIDIA GPU "
                                  f"({', '.join(sorted(GPU_FAMILIES))}) instance, or pass --image")
        return cls(name, family)

    @property
    def accelerator(self) -> str:
        """``neuron`` (the djl-neuronx image) or ``gpu`` (the djl-lmi image)."""
        return "neuron" if self.family in NEURON_FAMILIES else "gpu"

    @property
    def has_local_nvme(self) -> bool:
        generation_suffix = re.sub(r"^[a-z]+\d+", "", self.family)
        return "d" in generation_suffix or self.family in NVME_WITHOUT_D

    @property
    def accepts_volume_size(self) -> bool:
        """Whether ``VolumeSizeInGB`` may be set: EBS-only families only (see the module docstring)."""
        return not self.has_local_nvme


def parse_any(name: str) -> HostingInstance:
    """Like ``HostingInstance.parse`` but accepting any well-formed type (used with an explicit --image)."""
    match = INSTANCE_TYPE.fullmatch(name)
    if match is None:
        return HostingInstance.parse(name)  # raises the usage error
    return HostingInstance(name, match.group("family"))
