"""LMI image URIs by instance family and region; the optional sagemaker SDK path through a fake module."""

import sys
import types

import pytest

from lmi_tools.errors import UsageError
from lmi_tools.instances import INSTANCES, HostingInstance
from lmi_tools.sagemaker.images import resolve_image, table_uri


@pytest.fixture(autouse=True)
def no_sagemaker_sdk(monkeypatch):
    """Tests see our table unless they install a fake SDK (a real one may be installed beside us)."""
    monkeypatch.setitem(sys.modules, "sagemaker", None)


@pytest.mark.parametrize("instance, region, uri", [
    ("ml.inf2.48xlarge", "us-east-1",
     "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.29.0-neuronx-sdk2.19.1"),
    ("ml.trn1.32xlarge", "ca-west-1",
     "204538143572.dkr.ecr.ca-west-1.amazonaws.com/djl-inference:0.29.0-neuronx-sdk2.19.1"),
    ("ml.g5.12xlarge", "us-west-2", "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.29.0-lmi11.0.0-cu124"),
    ("ml.g5.12xlarge", "af-south-1",
     "626614931356.dkr.ecr.af-south-1.amazonaws.com/djl-inference:0.29.0-lmi11.0.0-cu124"),
    ("ml.p4d.24xlarge", "cn-north-1",
     "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/djl-inference:0.29.0-lmi11.0.0-cu124"),
])
def test_the_family_picks_neuronx_or_gpu_and_the_region_picks_the_account(instance, region, uri):
    choice = resolve_image(HostingInstance.parse(instance), region)
    assert (choice.uri, choice.source) == (uri, "lmi_tools table")


def test_lmi_version_selects_the_tag():
    assert resolve_image(HostingInstance.parse("ml.g5.2xlarge"), "us-east-1", lmi_version="0.33.0").uri.endswith(
        ":0.33.0-lmi15.0.0-cu128")
    assert table_uri("djl-neuronx", "0.27.0", "eu-west-1").endswith(":0.27.0-neuronx-sdk2.18.1")


@pytest.mark.parametrize("kwargs, message", [
    ({"instance": "ml.g5.2xlarge", "region": "us-east-1", "lmi_version": "0.99.0"}, "not in the image table"),
    ({"instance": "ml.inf2.xlarge", "region": "af-south-1"}, "no djl-neuronx image is known in region af-south-1"),
    ({"instance": "ml.g5.2xlarge", "region": "mars-east-1"}, "no djl-lmi image is known"),
    ({"instance": "ml.g5.2xlarge", "region": "us-east-1", "image": "x", "lmi_version": "0.29.0"}, "exclude"),
])
def test_unknown_images_are_usage_errors_with_what_is_known(kwargs, message):
    instance = HostingInstance.parse(kwargs.pop("instance"))
    with pytest.raises(UsageError, match=message) as info:
        resolve_image(instance, **kwargs)
    assert info.value.hint


def test_an_explicit_image_is_used_as_is():
    choice = resolve_image(HostingInstance.parse("ml.g5.2xlarge"), "us-east-1", image="my.ecr/img:1")
    assert (choice.uri, choice.source) == ("my.ecr/img:1", "--image")


@pytest.mark.parametrize("name, message", [("inf2.xlarge", "ml.<family>"), ("ml.m5.xlarge", "no LMI image"),
                                           ("ml.inf1.xlarge", "no LMI image")])
def test_instances_without_an_lmi_image_are_refused(name, message):
    with pytest.raises(UsageError, match=message):
        HostingInstance.parse(name)


@pytest.mark.parametrize("name, accelerator, volume", [
    ("ml.inf2.48xlarge", "neuron", True), ("ml.inf2.xlarge", "neuron", True),
    ("ml.trn1.32xlarge", "neuron", False), ("ml.g5.12xlarge", "gpu", False), ("ml.g4dn.xlarge", "gpu", False),
    ("ml.p4d.24xlarge", "gpu", False), ("ml.g6.xlarge", "gpu", False), ("ml.p3.2xlarge", "gpu", True),
])
def test_accelerator_and_volume_rule(name, accelerator, volume):
    host = HostingInstance.parse(name)
    assert (host.kind, host.accepts_volume_size) == (accelerator, volume)


@pytest.mark.parametrize("name, volume", [("ml.m5.xlarge", True), ("ml.c5d.xlarge", False),
                                          ("ml.c6id.large", False), ("ml.r5.large", True)])
def test_volume_rule_for_other_families(name, volume):
    assert HostingInstance.parse_any(name).accepts_volume_size is volume


def test_every_size_in_the_table_is_a_hosting_instance_of_the_same_kind():
    for name, instance in INSTANCES.items():
        host = HostingInstance.parse(f"ml.{name}")
        assert (host.family, host.kind) == (instance.family, instance.kind)


def fake_sdk(monkeypatch, retrieve, module="sagemaker.image_uris"):
    package = types.ModuleType("sagemaker")
    image_uris = types.ModuleType(module)
    image_uris.retrieve = retrieve
    package.image_uris = image_uris
    monkeypatch.setitem(sys.modules, "sagemaker", package)
    monkeypatch.setitem(sys.modules, "sagemaker.core", None)  # v2 layout: no sagemaker.core
    monkeypatch.setitem(sys.modules, module, image_uris)


def test_the_sagemaker_sdk_is_preferred_when_installed(monkeypatch):
    calls = []

    def retrieve(framework, region, version=None):
        calls.append((framework, region, version))
        return f"sdk/{framework}:{version}"

    fake_sdk(monkeypatch, retrieve)
    choice = resolve_image(HostingInstance.parse("ml.inf2.24xlarge"), "eu-west-1", lmi_version="0.28.0")
    assert (choice.uri, choice.source) == ("sdk/djl-neuronx:0.28.0", "sagemaker SDK (sagemaker.image_uris)")
    assert calls == [("djl-neuronx", "eu-west-1", "0.28.0")]


def test_an_image_the_sdk_lacks_falls_back_to_our_table(monkeypatch):
    def retrieve(framework, region, version=None):
        raise ValueError(f"Unsupported {framework} version: {version}")

    fake_sdk(monkeypatch, retrieve)
    choice = resolve_image(HostingInstance.parse("ml.g5.2xlarge"), "us-east-1", lmi_version="0.38.0")
    assert choice.source == "lmi_tools table" and choice.uri.endswith(":0.38.0-lmi29.0.0-cu130")
