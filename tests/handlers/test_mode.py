"""``mode.serving_mode``: which of DJL's Python engines an LMI image runs a model with, by the rules of djl-serving's
``PyModel`` (``option.async_mode``) and ``LmiConfigRecommender.setRollingBatch`` (from DJL 0.35.0)."""

import pytest

from lmi_handlers.config import HandlerConfig
from lmi_handlers.mode import Image, serving_mode

LMI = Image("djl-lmi", "0.36.0")
LLM = ["LlamaForCausalLM"]


@pytest.mark.parametrize("properties, image, architectures, asynchronous, reason", [
    ({}, LMI, LLM, True, "option.rolling_batch is not set on djl-lmi:0.36.0: LMI's recommender sets"),
    ({"rolling_batch": "auto"}, LMI, LLM, True, "option.rolling_batch is auto"),
    ({"async_mode": "false"}, LMI, LLM, True, "(over option.async_mode=false)"),  # the recommender writes first
    ({"rolling_batch": "disable"}, LMI, LLM, False, "option.rolling_batch=disable keeps the recommender off"),
    ({"rolling_batch": "vllm"}, LMI, LLM, False, "option.rolling_batch=vllm keeps the recommender off"),
    ({"batch_size": "4"}, LMI, LLM, False, "batch_size > 1"),
    ({}, LMI, None, False, "finds no config.json"),
    ({}, LMI, ["BertModel"], False, "BertModel is no text generation"),
    ({}, LMI, ["T5ForConditionalGeneration"], True, "LMI's recommender sets"),
    ({}, Image("djl-tensorrtllm", "0.36.0"), LLM, True, "LMI's recommender sets"),
    ({}, Image("djl-lmi", "0.33.0"), LLM, False, "recommender sets it only from DJL 0.35.0"),
    ({"async_mode": "true", "rolling_batch": "disable"}, Image("djl-lmi", "0.33.0"), LLM, True,
     "option.async_mode=true"),
    ({"async_mode": "TRUE"}, None, None, True, "option.async_mode=TRUE"),  # Boolean.parseBoolean
    ({"async_mode": "yes"}, None, None, False, "option.async_mode=yes"),
    ({}, None, LLM, False, "no LMI image is targeted"),
    ({"async_mode": "true"}, Image("djl-neuronx", "0.30.0"), LLM, False, "has only the synchronous engine: option"),
    ({}, Image("djl-lmi", "0.29.0"), LLM, False, "has only the synchronous engine"),
    ({}, Image("djl-serving", "0.36.0", serving_features=""), LLM, False, "is no vLLM or TensorRT-LLM image"),
])
def test_the_engine_each_image_runs(properties, image, architectures, asynchronous, reason):
    mode = serving_mode(properties, image, architectures)
    assert mode.asynchronous is asynchronous and reason in mode.reason
    # What Java writes on the way: the recommender's settings, only where it turns the mode on.
    recommended = "LMI's recommender sets" in mode.reason
    assert mode.properties == ({"async_mode": "true", "rolling_batch": "disable"} if recommended else {})


def test_the_handler_reads_the_mode_as_java_does_and_names_djls_batching_beside_it():
    assert HandlerConfig.from_properties({"async_mode": "True"}).async_mode
    assert not HandlerConfig.from_properties({"async_mode": "on"}).async_mode
    for key, value in (("rolling_batch", "scheduler"), ("batch_size", "4")):
        conflict = HandlerConfig.from_properties({"async_mode": "true", key: value}).async_conflict()
        assert conflict.key == key and "option.rolling_batch=disable and batch_size=1" in str(conflict)
    assert HandlerConfig.from_properties({"async_mode": "true", "rolling_batch": "disable"}).async_conflict() is None
