"""vLLM's own answers for the tests: ``LLM.generate``, greedy, in a process of its own.

Run as ``python reference.py MODEL_DIR MAX_TOKENS ENGINE_ARGS_JSON OUT [LORA_DIR]`` with a JSON list of prompts on
stdin; writes a JSON list of ``{"text", "token_ids"}`` to OUT (vLLM logs to stdout). With LORA_DIR every prompt runs
with that LoRA adapter (``LoRARequest``), the engine arguments enabling LoRA, except a prompt given as
``{"prompt": ..., "lora": false}``.
"""

import json
import sys

def main() -> None:
    from vllm import LLM, SamplingParams

    model, max_tokens, engine, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    lora = None
    if len(sys.argv) > 5:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=sys.argv[5])
    prompts = json.load(sys.stdin)
    plain = [i for i, p in enumerate(prompts) if isinstance(p, dict) and not p.get("lora", True)]
    adapted = [i for i in range(len(prompts)) if i not in plain]
    llm = LLM(model=model, **engine)
    answers = {}
    # Each group in a generate call of its own, as a server would batch them.
    for group, request in ((plain, None), (adapted, lora)):
        texts = [prompts[i]["prompt"] if isinstance(prompts[i], dict) else prompts[i] for i in group]
        outputs = llm.generate(texts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False,
                               lora_request=request) if group else []
        answers.update({i: {"text": o.outputs[0].text, "token_ids": list(o.outputs[0].token_ids)}
                        for i, o in zip(group, outputs)})
    with open(out, "w") as file:
        json.dump([answers[i] for i in range(len(prompts))], file)


if __name__ == "__main__":
    main()
