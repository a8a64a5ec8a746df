"""docs/fleet.md's fleet (issue 47), checked as text: its manifests parse, agree with each other (labels, ports,
the drain against the grace period) and name what the server really exports; its serving.properties parse with the
runtime's own options. No Kubernetes runs here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from lmi_handlers.gauges import GAUGES, LORA_INFO
from lmi_handlers.kv_events import KVEventsOptions
from lmi_handlers.scheduler import priority_scheduling
from lmi_tools.modeldir.properties import parse_properties

DOC = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def manifests() -> dict[tuple[str, str], dict]:
    found = {}
    for block in blocks("yaml"):
        for doc in yaml.safe_load_all(block):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def test_the_pool_selects_the_replicas_and_the_picker_reads_vllms_names():
    docs = manifests()
    replicas, pool = docs[("Deployment", "tiny")], docs[("InferencePool", "tiny")]
    pod = replicas["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    http = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert [port["number"] for port in pool["spec"]["targetPorts"]] == [http]
    assert container["command"][container["command"].index("--port") + 1] == str(http)
    assert container["readinessProbe"]["httpGet"] == {"path": "/ping", "port": http}
    drain = float(container["command"][container["command"].index("--drain-timeout") + 1])
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain
    picker = docs[("Deployment", pool["spec"]["endpointPickerRef"]["name"])]["spec"]["template"]["spec"]
    flags = dict(arg[2:].split("=", 1) for arg in picker["containers"][0]["args"])
    assert flags["pool-name"] == pool["metadata"]["name"] and flags["model-server-metrics-path"] == "/metrics"
    assert {flags[f"{name}-metric"] for name in ("total-queued-requests", "total-running-requests",
                                                 "kv-cache-usage-percentage", "lora-info")} == {*GAUGES, LORA_INFO}
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] in {
        p["containerPort"] for p in picker["containers"][0]["ports"]}


def test_the_model_directory_turns_on_what_the_fleet_reads():
    properties = [parse_properties(block) for block in blocks("properties")]
    model = next(p for p in properties if "engine" in p)
    options = {key[len("option."):]: value for key, value in model.items() if key.startswith("option.")}
    events = KVEventsOptions.from_properties(options)
    assert events is not None and options["enable_prefix_caching"] == "true" and priority_scheduling(options)
    kv_port = next(p["containerPort"] for p in manifests()[("Deployment", "tiny")]["spec"]["template"]["spec"][
        "containers"][0]["ports"] if p["name"] == "kv-events")
    assert events.endpoint == f"tcp://*:{kv_port}" and events.topic.startswith("kv@")
    for other in properties:  # every example parses with the runtime's own option parser
        if "option.kv_events_config" in other:
            json.loads(other["option.kv_events_config"])


def test_hyperpod_selects_kv_aware_routing():
    config = manifests()[("InferenceEndpointConfig", "tiny")]
    assert config["spec"]["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "kvaware"}
