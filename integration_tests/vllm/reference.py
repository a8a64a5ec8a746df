"""vLLM's own answers for the tests: ``LLM.generate``, greedy, in a process of its own.

Run as ``python reference.py MODEL_DIR MAX_TOKENS ENGINE_ARGS_JSON`` with a JSON list of prompts on stdin; prints
a JSON list of ``{"text", "token_ids"}``.
"""

import json
import sys

def main() -> None:
    from vllm import LLM, SamplingParams

    model, max_tokens, engine = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    prompts = json.load(sys.stdin)
    llm = LLM(model=model, **engine)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    json.dump([{"text": o.outputs[0].text, "token_ids": list(o.outputs[0].token_ids)} for o in outputs], sys.stdout)


if __name__ == "__main__":
    main()
