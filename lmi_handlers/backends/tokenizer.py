"""The transformers tokenizer behind the runtime's small ``Tokenizer`` surface (``backends/base.py``)."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import InvalidRequest
from ..structured.tools import ToolCalling, with_tool_prompt


class HFTokenizer:
    """The small tokenizer surface the runtime needs, over a transformers tokenizer."""

    def __init__(self, tokenizer: Any, generation_config: Any = None):
        self.hf = tokenizer
        eos = set()
        for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(i) for i in source)
        self.eos_ids = frozenset(eos)
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
        self._rust_decode = _plain_fast_decode(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        if self._rust_decode is not None:
            return self._rust_decode(list(ids), skip_special_tokens=True)
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: Sequence[tuple[str, str]], tools: ToolCalling | None = None) -> str:
        template = getattr(self.hf, "chat_template", None)
        if not template:
            raise InvalidRequest("messages: this model's tokenizer has no chat template; send the LMI schema "
                                 '({"inputs": ...}) instead', field="messages")
        turns = [{"role": r, "content": c} for r, c in messages]
        extra = {}
        if tools is not None and tools.active:
            # A template that renders tools gets them; for one that does not, they go in the system message.
            if "tools" in template:
                extra["tools"] = tools.templated()
            else:
                turns = with_tool_prompt(turns, tools)
        return self.hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **extra)

    def encode_chat(self, messages: Sequence[tuple[str, str]], tools: ToolCalling | None = None) -> list[int]:
        return list(self.hf(self.render_chat(messages, tools), add_special_tokens=False)["input_ids"])


def _plain_fast_decode(tokenizer: Any) -> Any:
    """The Rust tokenizer's own ``decode`` where transformers' ``decode`` would return exactly its text (a fast
    tokenizer that neither overrides decoding nor cleans up spaces), else None. Incremental detokenization
    decodes twice per token and sequence; the Python wrapper around it cost about 3/4 of that time."""
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    kind = type(tokenizer)
    plain = isinstance(tokenizer, PreTrainedTokenizerFast) and kind._decode is PreTrainedTokenizerFast._decode \
        and kind.decode is PreTrainedTokenizerBase.decode and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
    return tokenizer._tokenizer.decode if plain else None
