"""LoRA adapters through ``lmi serve`` over real sockets, on SmolLM2-135M-Instruct with adapters made by peft: the
``adapters/`` folder loaded at start (a bad adapter there is dropped, the base serves on), DJL's adapter management
API on the management listener (``src`` obeys ``--model-url-pattern``), every way a request names an adapter
(DJL's body field, SageMaker's adapter header and an adapter inference component, TGI's
``adapter_id``, OpenAI's ``model``), and deleting an adapter while a request streams with it."""

import json
import threading

import httpx
import openai
import pytest

pytestmark = pytest.mark.quality

PROMPT = "Write a haiku about the sea."
LMI = {"inputs": PROMPT, "parameters": {"max_new_tokens": 12}}


@pytest.fixture(scope="module")
def server(serve_module, smollm2_dir, make_lora, tmp_path_factory):
    model = serve_module.model_dir("smollm2", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                               "option.model_id": str(smollm2_dir), "option.rolling_batch": "scheduler",
                                               "option.enable_lora": "true", "option.max_lora_rank": 16})
    make_lora(smollm2_dir, model / "adapters" / "a1", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"], 1)
    make_lora(smollm2_dir, model / "adapters" / "toobig", ["q_proj"], 2, rank=32)
    extra = tmp_path_factory.mktemp("extra")
    make_lora(smollm2_dir, extra / "a2", ["q_proj", "k_proj", "o_proj", "gate_proj"], 3)
    server = serve_module([model], ready=False, args=["--model-url-pattern", f"{extra}/.*"]).wait_ready(timeout=300)
    server.extra = extra
    server.model = model
    return server


def text(response):
    assert response.status_code == 200, response.text
    return response.json()["generated_text"]


def test_the_folder_adapters_load_at_start_and_a_bad_one_is_dropped(server):
    listed = httpx.get(f"{server.management_url}/models/smollm2/adapters").json()["adapters"]
    assert [a["name"] for a in listed] == ["a1"]
    assert "adapter toobig" in server.logs() and "max_lora_rank=16" in server.logs()


def test_management_registers_describes_updates_and_checks_the_source(server, smollm2_dir):
    url = f"{server.management_url}/models/smollm2/adapters"
    refused = httpx.post(url, params={"name": "a9", "src": str(server.model / "adapters" / "a1")})
    assert refused.status_code == 403 and "--model-url-pattern" in refused.json()["message"]
    done = httpx.post(url, params={"name": "a2", "src": str(server.extra / "a2")}, timeout=120)
    assert done.json() == {"status": "Adapter a2 registered"}
    assert httpx.post(url, params={"name": "a2", "src": str(server.extra / "a2")}).status_code == 409
    assert httpx.post(f"{url}/a2/update", params={"pin": "true"}).json() == {"status": "Adapter a2 updated"}
    assert httpx.get(f"{url}/a2").json() == [{"name": "a2", "src": str(server.extra / "a2"), "pin": True}]
    page = httpx.get(url, params={"limit": 1}).json()
    assert [a["name"] for a in page["adapters"]] == ["a1"] and page["nextPageToken"] == "1"
    assert httpx.get(f"{server.management_url}/adapters/a2").json()[0]["name"] == "a2"  # DJL's one-model paths
    missing = httpx.get(f"{url}/nope")
    assert missing.status_code == 404 and "a1, a2" in missing.json()["message"]


def test_malformed_adapter_files_and_a_nul_byte_are_400s_naming_the_adapter_and_the_file(server):
    url = f"{server.management_url}/models/smollm2/adapters"
    for i, (files, message) in enumerate([
            ({"adapter_config.json": b"[]"}, "adapter_config.json is a JSON list; expected an object"),
            ({"adapter_config.json": b'{"r": 8'}, "adapter_config.json is not valid JSON"),
            ({"adapter_model.safetensors": b"\x00garbage\x00" * 4},
             "adapter_model.safetensors is not a safetensors file")]):
        bad = server.extra / f"bad{i}"
        bad.mkdir()
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            (bad / name).write_bytes(files.get(name) or (server.extra / "a2" / name).read_bytes())
        answer = httpx.post(url, params={"name": "bad", "src": str(bad)}, timeout=120)
        assert answer.status_code == 400 and answer.json()["message"].startswith(f"adapter bad ({bad}): {message}")
    nul = httpx.post(url, params={"name": "nul", "src": f"{server.extra}/a2\x00x"}, timeout=120)
    assert nul.status_code == 400 and "adapter nul: " in nul.json()["message"] and "NUL byte" in nul.json()["message"]
    assert "bad" not in [a["name"] for a in httpx.get(url).json()["adapters"]] and text(httpx.post(
        f"{server.url}/invocations", json={**LMI, "adapters": "a1"}, timeout=120))  # the model serves on


def test_every_request_form_reaches_the_adapter(server):
    base = text(httpx.post(f"{server.url}/invocations", json=LMI, timeout=120))
    body = text(httpx.post(f"{server.url}/invocations", json={**LMI, "adapters": "a1"}, timeout=120))
    assert body != base
    header = text(httpx.post(f"{server.url}/invocations", json=LMI, timeout=120,
                             headers={"X-Amzn-SageMaker-Adapter-Identifier": "a1"}))
    component = text(httpx.post(f"{server.url}/endpoints/e/invocations", json=LMI, timeout=120,
                                headers={"X-Amzn-SageMaker-Inference-Component": "a1"}))
    tgi = text(httpx.post(f"{server.url}/generate", timeout=120,
                          json={"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "adapter_id": "a1"}}))
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    completion = oai.completions.create(model="a1", prompt=PROMPT, max_tokens=12, temperature=0)
    assert [header, component, tgi, completion.choices[0].text] == [body] * 4
    assert "a1" in [m.id for m in oai.models.list().data]
    chat = [{"role": "user", "content": PROMPT}]
    answers = [oai.chat.completions.create(model=m, messages=chat, max_tokens=12, temperature=0).choices[0]
               .message.content for m in ("smollm2", "a1")]
    assert answers[0] != answers[1]


def test_the_chat_pages_menu_lists_adapters_under_their_model(server):
    listing = httpx.get(f"{server.url}/ui/models").json()["models"]
    assert {"name": "a1", "status": "READY", "parent": "smollm2"} in listing


def test_an_unknown_adapter_is_a_404_naming_the_registered_ones(server):
    answer = httpx.post(f"{server.url}/invocations", json={**LMI, "adapters": "nope"}, timeout=120)
    assert answer.status_code == 404 and "'nope'" in answer.text and "a1" in answer.text


def test_deleting_an_adapter_lets_a_running_request_finish_and_refuses_new_ones(server, smollm2_dir):
    url = f"{server.management_url}/models/smollm2/adapters"
    assert httpx.post(url, params={"name": "gone", "src": str(server.extra / "a2")}, timeout=120).status_code == 200
    lines, first = [], threading.Event()

    def stream():
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 40, "ignore_eos": True}, "stream": True,
                "adapters": "gone"}
        with httpx.stream("POST", f"{server.url}/invocations", json=body, timeout=120) as response:
            for line in response.iter_lines():
                lines.append(line)
                first.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(120)
    assert httpx.delete(f"{url}/gone", timeout=120).json() == {"status": "Adapter gone unregistered"}
    reader.join(120)
    tokens = [json.loads(line) for line in lines if line.strip()]
    assert sum("token" in t for t in tokens) == 40  # all of it, under the adapter deleted meanwhile
    again = httpx.post(f"{server.url}/invocations", json={**LMI, "adapters": "gone"}, timeout=120)
    assert again.status_code == 404
    assert [a["name"] for a in httpx.get(url).json()["adapters"]] == ["a1", "a2"]
