"""The host-side ``sample()`` loops: prompt forward, then one forward per new token.

Two flavours, as in the real library: the Llama loop (top-k/top-p/temperature, rows that produced
EOS keep receiving EOS, stops when every row is done) and the simple loop of the other classes
(top-k only, EOS is never sampled). ``sequence_length`` counts prompt and new tokens, and the result
includes the prompt.
"""

import torch


def _choose(scores, top_k, top_p):
    values, indices = torch.topk(scores, min(top_k, scores.shape[-1]))
    if top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        cut = probs.cumsum(dim=-1) - probs > top_p  # drop tokens once the mass before them passes top_p
        values = values.masked_fill(cut, float("-inf"))
    picked = torch.multinomial(torch.softmax(values, dim=-1, dtype=torch.float32), 1, replacement=True)
    return torch.gather(indices, 1, picked)


def sample_loop(model, input_ids, start_ids, sequence_length, *, eos_token_id, llama_style, top_k=50, top_p=1.0,
                temperature=1.0, streamer=None):
    if llama_style and not (isinstance(temperature, float) and temperature > 0):
        raise ValueError("temperature has to be a strictly positive float.")
    input_ids = torch.as_tensor(input_ids)
    _, start = input_ids.shape
    scores = model(input_ids, None, start_ids)
    tokens = [input_ids]
    done = torch.zeros(input_ids.shape[0], 1, dtype=torch.bool)
    for length in range(start, sequence_length):
        if not llama_style and eos_token_id is not None:
            scores[:, eos_token_id] = float("-inf")
        if temperature != 1.0:
            scores = scores / temperature
        chosen = _choose(scores, top_k, top_p)
        emitted = chosen
        if llama_style and eos_token_id is not None:
            done |= chosen == eos_token_id
            emitted = torch.where(done, torch.full_like(chosen, eos_token_id), chosen)
        tokens.append(emitted)
        if streamer is not None:
            streamer.put(emitted)
        if length + 1 >= sequence_length or (llama_style and bool(done.all())):
            break
        scores = model(chosen, torch.as_tensor([length]), start_ids)
    if streamer is not None:
        streamer.end()
    return torch.cat(tokens, dim=-1)
