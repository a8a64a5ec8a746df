"""``lmi invoke`` and the invoke library against lmi serve's SageMaker Runtime paths (scripted models, no AWS):
tiny PayloadParts that split lines and characters, a failure mid-stream, chat, unsigned local calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from lmi_tools.errors import ModelFailed
from lmi_tools.sagemaker.invoke import invoke, invoke_stream, request_body

ROOT = Path(__file__).resolve().parents[1]
TEXT = "na\u00efve caf\u00e9 \u2014 \u2713"  # 2- and 3-byte characters, split by 3-byte parts
FULL = json.dumps({"max_new_tokens": len(TEXT.encode())})


@pytest.fixture(scope="module")
def server(serve_module):
    # serving.properties is read as ISO-8859-1 (Java's Properties.load): non-ASCII text goes in as \uXXXX escapes.
    escaped = TEXT.encode("ascii", "backslashreplace").decode().replace("\\x", "\\u00")
    model = serve_module.scripted("chatty", **{"option.rolling_batch": "auto", "option.scripted_text": escaped,
                                               "option.max_new_tokens": 64})
    return serve_module([model], args=["--sagemaker-part-size", "3"])


@pytest.fixture(scope="module")
def runtime(server):
    return boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 1}))


def lmi(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # No credentials anywhere: lmi invoke sends unsigned requests to a local --endpoint-url.
    clean.update(AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
                 AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "lmi_tools", *args], cwd=ROOT, env=clean, capture_output=True,
                          text=True, timeout=60)


def test_streamed_tokens_rebuild_the_text_across_split_characters(runtime):
    tokens = invoke_stream(runtime, "chatty", request_body("hi", {"max_new_tokens": len(TEXT.encode())}, stream=True))
    assert "".join(tokens) == TEXT == tokens.answer.text
    assert tokens.content_type == "application/jsonlines"
    assert invoke(runtime, "chatty", request_body("hi", {"max_new_tokens": len(TEXT.encode())})).text == TEXT


def test_chat_streams_as_server_sent_events(runtime):
    tokens = invoke_stream(runtime, "chatty", request_body("hi", {"max_tokens": 6}, stream=True, chat=True),
                           accept="text/event-stream")
    assert "".join(tokens) == TEXT.encode()[:6].decode("utf-8", "ignore")
    assert tokens.content_type == "text/event-stream"


def test_a_bad_request_is_a_model_error_with_the_containers_message(runtime):
    with pytest.raises(ModelFailed, match="the model answered 400: .*inputs") as info:
        invoke(runtime, "chatty", {"inputs": ""})
    assert "log" in info.value.hint


def test_cli_streams_without_credentials_to_a_local_endpoint(server):
    done = lmi("invoke", "chatty", "--prompt", "hi", "--stream", "--parameters", FULL,
               "--endpoint-url", server.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout == TEXT + "\n"


def test_cli_reports_a_failure_mid_stream_and_keeps_the_text(server):
    done = lmi("invoke", "chatty", "--prompt", "[[fail@4]]", "--stream", "--endpoint-url", server.url)
    assert done.returncode == ModelFailed.exit_code
    assert done.stdout == "na\n"  # the three tokens before the failure: "n", "a" and half of "\u00ef"
    error, hint = done.stderr.strip().splitlines()
    assert error.startswith("error: the model failed in the middle of the stream: ") and "scripted failure" in error
    assert hint.startswith("hint: ")


def test_cli_prints_the_raw_body_on_request(server):
    done = lmi("invoke", "chatty", "--prompt", "hi", "--raw", "--parameters", '{"max_new_tokens": 2}',
               "--endpoint-url", server.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"generated_text": "na"}
