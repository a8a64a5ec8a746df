"""Fixtures of the handler tests: the transformers-neuronx stand-in and tiny models of each architecture, and one
rolling-batch handler on the tiny model shared by the tests of a step's failures and of grammar admission."""

import pytest

from lmi_handlers.protocol import Input

from .neuronx_support import neuronx_standin, reference, tiny_arch  # noqa: F401 - registered as fixtures here


@pytest.fixture(scope="session")
def tiny_rolling_handler(tiny_model_dir, tmp_path_factory, make_lora):
    """The hf engine's rolling batch on the tiny model (paged, up to 16 sequences), with the LoRA adapters ``good``
    and ``broken`` registered (a test that needs ``broken`` broken breaks it)."""
    from .test_hf_backend import loaded

    handler = loaded(tiny_model_dir, tmp_path_factory.mktemp("rolling"), rolling_batch="scheduler",
                     max_rolling_batch_size=16, enable_lora="true")
    root = tmp_path_factory.mktemp("adapters")
    for seed, name in enumerate(("good", "broken"), 1):
        inputs = Input({"name": name, "src": make_lora(tiny_model_dir, root / name, ["q_proj", "v_proj"], seed)})
        assert handler.manage_adapter(inputs, "register").code == 200
    return handler
