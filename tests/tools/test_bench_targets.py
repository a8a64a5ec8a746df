"""TARGET syntax: the URL path names the API unless --api does; some paths decide streaming."""

import pytest

from lmi_tools.answers.messages import Api
from lmi_tools.bench.targets import parse_target
from lmi_tools.errors import UsageError


@pytest.mark.parametrize("target, api, stream, url", [
    ("http://127.0.0.1:8080/predictions/model", Api.LMI, True, "http://127.0.0.1:8080/predictions/model"),
    ("http://h:8080/predictions/model/v2", Api.LMI, True, "http://h:8080/predictions/model/v2"),
    ("http://h:8080/invocations?model_name=a", Api.LMI, True, "http://h:8080/invocations?model_name=a"),
    ("http://h/models/a/invoke", Api.LMI, True, "http://h/models/a/invoke"),
    ("http://h:3000/generate_stream", Api.TGI, True, "http://h:3000/generate_stream"),
    ("http://h:3000/generate", Api.TGI, False, "http://h:3000/generate"),
    ("https://h/v1/completions", Api.OPENAI_COMPLETIONS, True, "https://h/v1/completions"),
    ("http://h:8000/v1/chat/completions", Api.OPENAI_CHAT, True, "http://h:8000/v1/chat/completions"),
])
def test_the_path_names_the_api(target, api, stream, url):
    resolved = parse_target(target)
    assert (resolved.api, resolved.stream, resolved.url) == (api, stream, url)


@pytest.mark.parametrize("api, stream, url", [
    ("lmi", None, "http://h:1/invocations"),
    ("tgi", None, "http://h:1/generate_stream"),
    ("tgi", False, "http://h:1/generate"),
    ("openai-completions", None, "http://h:1/v1/completions"),
    ("openai-chat", False, "http://h:1/v1/chat/completions"),
])
def test_a_bare_host_gets_the_api_default_path(api, stream, url):
    resolved = parse_target("http://h:1", api, stream)
    assert resolved.url == url and resolved.stream is (stream if stream is not None else True)


def test_api_overrides_the_path_for_gateways_with_their_own_routes():
    resolved = parse_target("https://gw.example.com/llm/run", "openai-chat")
    assert resolved.api is Api.OPENAI_CHAT and resolved.url == "https://gw.example.com/llm/run"


@pytest.mark.parametrize("target, stream, endpoint_url, region, streaming", [
    ("http://127.0.0.1:8080/endpoints/tiny/invocations-response-stream", None, "http://127.0.0.1:8080",
     "us-east-1", True),
    ("http://127.0.0.1:8080/endpoints/tiny/invocations", None, "http://127.0.0.1:8080", "us-east-1", False),
    ("http://127.0.0.1:8080/endpoints/tiny", False, "http://127.0.0.1:8080", "us-east-1", False),
    ("https://runtime.sagemaker.eu-west-1.amazonaws.com/endpoints/tiny/invocations-response-stream", None,
     "https://runtime.sagemaker.eu-west-1.amazonaws.com", "eu-west-1", True),
])
def test_sagemaker_urls_become_boto3_endpoint_url(target, stream, endpoint_url, region, streaming):
    resolved = parse_target(target, stream=stream)
    assert resolved.api is Api.SAGEMAKER and resolved.endpoint_name == "tiny"
    assert (resolved.endpoint_url, resolved.region, resolved.stream) == (endpoint_url, region, streaming)


def test_sagemaker_endpoint_by_name():
    resolved = parse_target("sagemaker:my-endpoint", region="us-west-2")
    assert (resolved.api, resolved.endpoint_name, resolved.endpoint_url, resolved.region, resolved.stream) == (
        Api.SAGEMAKER, "my-endpoint", None, "us-west-2", True)
    assert resolved.describe() == {"api": "sagemaker", "stream": True, "endpoint_name": "my-endpoint",
                                   "endpoint_url": None, "region": "us-west-2"}


@pytest.mark.parametrize("target, api, stream, message", [
    ("http://h:1/", None, None, "cannot tell the API"),
    ("http://h:1/something", None, None, "cannot tell the API"),
    ("ftp://h/predictions/x", None, None, "not an http(s) URL"),
    ("localhost:8080/predictions/x", None, None, "not an http(s) URL"),
    ("http://h:1/predictions/m", "grpc", None, "--api 'grpc' is not one of"),
    ("http://h:3000/generate", None, True, "--stream contradicts"),
    ("http://h/endpoints/e/invocations-response-stream", None, False, "--no-stream contradicts"),
    ("http://h:1/v1/completions", "sagemaker", None, "does not name a SageMaker endpoint"),
    ("sagemaker:", None, None, "needs an endpoint name"),
    ("sagemaker:e", "tgi", None, "needs an endpoint name and --api sagemaker"),
])
def test_bad_targets_say_what_is_wrong(target, api, stream, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_target(target, api, stream)
