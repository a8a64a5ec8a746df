"""What hostile grammars cost a stream that shares their rolling batch (issue 43).

A stream of 1,500 greedy tokens runs through ``handle()`` with DJLServing's rolling-batch step protocol (a tiny
random Llama with 2,048 positions, hf backend, CPU: constrained answers are valid whatever the model). At its fifth
step 100 requests with a JSON schema arrive, and, in the last run, 5 hostile ones among them: a regex whose lexer
explodes (``(a{1000}){1000}``), a 1 MB ``guided_choice`` holding a secret, a schema whose required ``$ref``s loop,
the empty character class, and a valid 60,000-character alternation. Three runs in one process:

* ``alone`` - the stream by itself: its text, and the baseline of its gaps;
* ``valid`` - the stream beside the 100 schema requests;
* ``hostile`` - the stream beside the 100 schema requests and the 5 hostile ones.

    .venv/bin/python benchmarks/hostile_grammars.py [--tokens 1500] [--valid 100]

Prints, per run, the stream's longest and median gap between chunks and how long it took; then whether the stream's
text equals its text alone, how many schema answers are valid JSON that validates, and what each hostile request
got (its status and the start of its error). The target: the longest gap under 0.3 s with the hostile requests.
Figures, not assertions; on a shared machine the ratios matter more than the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmi_handlers.handler import Handler  # noqa: E402
from lmi_tools.models.tiny import TinySpec, build_tiny_model  # noqa: E402
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input  # noqa: E402

JSON = [("Content-Type", "application/json")]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
LOOP = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                  "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}},
        "$ref": "#/$defs/a"}
HOSTILE = [
    {"guided_regex": "(a{1000}){1000}"},
    {"guided_choice": [f"SECRET-TOKEN-12345-{i:06d}" for i in range(40_000)]},
    {"guided_json": LOOP},
    {"guided_regex": "[^\\x00-\\x{10FFFF}]"},
    {"guided_regex": "|".join(f"w{i * 7919}" for i in range(8_000))[:60_000].rsplit("|", 1)[0]},
]


def body(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def run(handler: Handler, tokens: int, valid: int, hostile: bool) -> dict:
    loop = RollingBatchLoop(max_size=valid + len(HOSTILE) + 1)
    stream = {"inputs": "the quick brown fox", "stream": True,
              "parameters": {"max_new_tokens": tokens, "ignore_eos": True}}
    joining = [("valid", i, {"inputs": f"Person {i} as JSON:", "parameters": {"max_new_tokens": 96,
                                                                             "guided_json": SCHEMA}})
               for i in range(valid)]
    if hostile:
        for k, parameters in enumerate(HOSTILE):
            joining.insert(k * (valid // len(HOSTILE)), ("hostile", k, {"inputs": "x", "parameters": {
                "max_new_tokens": 32, **parameters}}))
    loop.add(RollingRequest(request_input(JSON, body(stream)), seed=1, key=("stream", 0)))
    bodies, codes, times, steps = {}, {}, [], 0
    began = time.perf_counter()
    while loop.active:
        if steps == 5:
            for kind, i, payload in joining:
                loop.add(RollingRequest(request_input(JSON, body(payload)), seed=2 + i, key=(kind, i)))
        out = handler.handle(loop.next_input())
        now = time.perf_counter()
        for item in loop.apply(out.code, out.properties, [out.content.value_at(i) for i in range(out.content.size())]):
            key = item.request.key
            if item.code is not None:
                codes[key], bodies[key] = item.code, item.error or ""
            else:
                bodies[key] = bodies.get(key, "") + item.data
                if key[0] == "stream" and item.data:
                    times.append(now)
        steps += 1
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"max_gap_s": max(gaps), "median_gap_s": statistics.median(gaps), "took_s": times[-1] - began,
            "bodies": bodies, "codes": codes}


def text_of(stream_body: str) -> str:
    return json.loads(stream_body.splitlines()[-1])["generated_text"]


def valid_answers(result: dict) -> int:
    import jsonschema

    count = 0
    for (kind, _), answer in result["bodies"].items():
        if kind == "valid" and (kind, _) not in result["codes"]:
            try:
                jsonschema.validate(json.loads(json.loads(answer)["generated_text"]), SCHEMA)
                count += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1500, help="tokens the stream generates")
    parser.add_argument("--valid", type=int, default=100, help="schema requests beside it")
    parser.add_argument("--model-dir", type=Path, default=None, help="a tiny model with 2,048 positions (built when "
                                                                     "absent)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or Path(tmp) / "tiny"
        if not (model_dir / "config.json").is_file():
            build_tiny_model(model_dir, TinySpec(max_position_embeddings=2048))
        handler = Handler()
        assert handler.handle(init_input({
            "model_id": str(model_dir), "model_dir": str(model_dir), "backend": "hf", "rolling_batch": "scheduler",
            "max_rolling_batch_size": str(args.valid + len(HOSTILE) + 1)})) is None
        results = {name: run(handler, args.tokens, 0 if name == "alone" else args.valid, name == "hostile")
                   for name in ("alone", "valid", "hostile")}
    print(f"stream: {args.tokens} tokens; beside it: {args.valid} schema requests, then those and {len(HOSTILE)} "
          "hostile ones")
    print(f"{'run':8} {'longest gap':>12} {'median gap':>11} {'stream took':>12}")
    for name, r in results.items():
        print(f"{name:8} {r['max_gap_s'] * 1000:9.0f} ms {r['median_gap_s'] * 1000:8.1f} ms {r['took_s']:10.2f} s")
    alone = text_of(results["alone"]["bodies"][("stream", 0)])
    for name in ("valid", "hostile"):
        r = results[name]
        print(f"{name}: stream text equals its text alone: {text_of(r['bodies'][('stream', 0)]) == alone}; "
              f"schema answers that validate: {valid_answers(r)} of {args.valid}; longest gap / alone's: "
              f"{r['max_gap_s'] / results['alone']['max_gap_s']:.1f}x")
    for (kind, k), answer in sorted(results["hostile"]["bodies"].items()):
        if kind == "hostile":
            code = results["hostile"]["codes"].get((kind, k), 200)
            print(f"hostile {k}: {code} ({len(answer)} characters) {answer[:110]}")


if __name__ == "__main__":
    main()
