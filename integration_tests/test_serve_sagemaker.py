"""An unmodified boto3 sagemaker-runtime client against lmi serve's SageMaker Runtime paths."""

import json

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import EventStreamError


def runtime(server):
    return boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def server(serve_module):
    models = [serve_module.scripted("alpha", **{"option.rolling_batch": "auto", "option.max_new_tokens": 8}),
              serve_module.scripted("beta", **{"option.scripted_text": "beta!"})]
    return serve_module(models, args=["--sagemaker-part-size", "5"])


def test_invoke_endpoint(server):
    response = runtime(server).invoke_endpoint(EndpointName="alpha", Body=json.dumps({"inputs": "hi"}),
                                               ContentType="application/json", Accept="application/json",
                                               CustomAttributes="trace=1")
    assert json.loads(response["Body"].read()) == {"generated_text": " The qui"}
    assert response["ContentType"] == "application/json" and response["InvokedProductionVariant"] == "AllTraffic"


def test_stream_reassembles_lines_split_across_event_frames(server):
    response = runtime(server).invoke_endpoint_with_response_stream(
        EndpointName="alpha", Body=json.dumps({"inputs": "hi", "stream": True}), ContentType="application/json")
    parts = [event["PayloadPart"]["Bytes"] for event in response["Body"]]
    assert response["ContentType"] == "application/jsonlines"
    assert max(len(p) for p in parts) <= 5 and len(parts) > 8  # each line arrived in several frames
    lines = [json.loads(line) for line in b"".join(parts).decode().splitlines()]
    assert "".join(line["token"]["text"] for line in lines) == " The qui" == lines[-1]["generated_text"]


def test_stream_and_plain_paths_give_the_same_text_as_predictions(server):
    payload = {"inputs": "hi", "parameters": {"max_new_tokens": 5}}
    plain = httpx.post(server.url + "/predictions/beta", json=payload).json()["generated_text"]
    sagemaker = json.loads(runtime(server).invoke_endpoint(EndpointName="beta", Body=json.dumps(payload))["Body"]
                           .read())["generated_text"]
    streamed = runtime(server).invoke_endpoint_with_response_stream(
        EndpointName="beta", Body=json.dumps({**payload, "stream": True}), Accept="application/jsonlines")
    text = b"".join(e["PayloadPart"]["Bytes"] for e in streamed["Body"]).decode().splitlines()
    assert plain == sagemaker == json.loads(text[-1])["generated_text"] == "beta!"


def test_model_errors_before_the_stream_are_model_error(server):
    client = runtime(server)
    with pytest.raises(client.exceptions.ModelError) as info:
        client.invoke_endpoint(EndpointName="alpha", Body=b'{"inputs": ""}', ContentType="application/json")
    assert info.value.response["OriginalStatusCode"] == 400
    assert "inputs: expected a non-empty string" in info.value.response["OriginalMessage"]
    with pytest.raises(client.exceptions.ModelError):
        client.invoke_endpoint_with_response_stream(EndpointName="alpha", Body=b"{broken")


def test_a_failure_mid_stream_is_a_model_stream_error(server):
    response = runtime(server).invoke_endpoint_with_response_stream(
        EndpointName="alpha", Body=json.dumps({"inputs": "[[fail@4]]", "stream": True}))
    received = []
    with pytest.raises(EventStreamError) as info:
        for event in response["Body"]:
            received.append(event["PayloadPart"]["Bytes"])
    assert info.value.response["Error"]["Code"] == "ModelStreamError"
    assert "scripted failure" in info.value.response["Error"]["Message"]
    assert b"".join(received).count(b'"token"') == 3  # the tokens before the failure arrived


def test_unknown_endpoint_is_a_validation_error(server):
    client = runtime(server)
    with pytest.raises(client.exceptions.ClientError) as info:
        client.invoke_endpoint(EndpointName="gamma", Body=b'{"inputs": "x"}')
    assert info.value.response["Error"]["Code"] == "ValidationError"


def test_the_tiny_model_through_rolling_batch(serve, tiny_model_dir):
    """A real transformers model: /predictions plain, /predictions streamed and SageMaker agree."""
    model = serve.model_dir("tiny", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                     "option.model_id": str(tiny_model_dir), "option.rolling_batch": "auto"})
    server = serve([model])
    payload = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 16}}
    plain = httpx.post(server.url + "/predictions/tiny", json=payload, timeout=60).json()["generated_text"]
    with httpx.stream("POST", server.url + "/predictions/tiny", json={**payload, "stream": True}, timeout=60) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) == 16 and "".join(line["token"]["text"] for line in lines) == plain
    streamed = runtime(server).invoke_endpoint_with_response_stream(EndpointName="tiny",
                                                                    Body=json.dumps({**payload, "stream": True}))
    text = b"".join(e["PayloadPart"]["Bytes"] for e in streamed["Body"]).decode().splitlines()
    assert json.loads(text[-1])["generated_text"] == plain


def test_an_endpoint_of_inference_components_routes_by_component_name(serve_module):
    """``lmi serve --endpoint pool``: boto3's InferenceComponentName picks the model, plain and streamed, as on an
    endpoint whose name is none of its components' names."""
    server = serve_module([serve_module.scripted("chat", **{"option.scripted_text": "chat!"}),
                           serve_module.scripted("code", **{"option.scripted_text": "code!"})],
                          args=["--endpoint", "pool", "--sagemaker-part-size", "3"])
    client = runtime(server)
    for name in ("chat", "code"):
        body = {"inputs": "hi", "parameters": {"max_new_tokens": 5}}
        plain = client.invoke_endpoint(EndpointName="pool", InferenceComponentName=name, Body=json.dumps(body),
                                       ContentType="application/json")
        assert json.loads(plain["Body"].read()) == {"generated_text": f"{name}!"}
        streamed = client.invoke_endpoint_with_response_stream(
            EndpointName="pool", InferenceComponentName=name, Body=json.dumps({**body, "stream": True}))
        lines = b"".join(e["PayloadPart"]["Bytes"] for e in streamed["Body"]).decode().splitlines()
        assert json.loads(lines[-1])["generated_text"] == f"{name}!"
    for endpoint, component, message in (("pool", None, "hosts inference components"),
                                         ("pool", "nope", "Inference component nope not found"),
                                         ("chat", "chat", "Endpoint chat of account")):
        extra = {"InferenceComponentName": component} if component else {}
        with pytest.raises(client.exceptions.ValidationError, match=message):
            client.invoke_endpoint(EndpointName=endpoint, Body=b'{"inputs": "hi"}', **extra)
