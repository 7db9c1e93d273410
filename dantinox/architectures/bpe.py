"""The tokenizer of a published model: byte-level BPE
(Hugging Face `tokenizers`) and its Jinja2 chat template.

Built from a GGUF file's metadata (vocabulary, merges, token types, chat template) or from a Hugging Face
checkpoint's tokenizer.json. The template is data from the file, so it is rendered in Jinja2's immutable
sandbox: it can read the messages and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3  # llama.cpp's token type of special tokens such as <|im_start|>


class BPETokenizer:
    """encode(text) -> ids, decode(ids) -> text, chat(messages) -> ids;
    no special tokens are added to text."""

    def __init__(self, backend: Tokenizer, chat_template: str | None = None, eos_id: int | None = None,
                 bos_token: str = "", eos_token: str = ""):
        self.backend = backend
        self.chat_template = chat_template
        self.eos_id = eos_id
        self._special = dict(bos_token=bos_token, eos_token=eos_token)

    @classmethod
    def from_gguf_fields(cls, tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str],
                         pre: str, chat_template: str | None, bos_id: int | None,
                         eos_id: int | None) -> BPETokenizer:
        """The GGUF 'gpt2' tokenizer: tokens are already spelled in the byte-level alphabet."""
        vocab = {token: i for i, token in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        backend = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
        level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        # llama.cpp's "smollm" pre-tokenizer cuts digits apart before the GPT-2 split,
        # as SmolLM's tokenizer.json does
        digits = pre_tokenizers.Digits(individual_digits=True)
        backend.pre_tokenizer = pre_tokenizers.Sequence([digits, level]) if pre == "smollm" else level
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, kind in zip(tokens, token_types, strict=True) if kind == CONTROL])
        name = {i: t for i, t in enumerate(tokens)}
        return cls(backend, chat_template, eos_id, bos_token=name.get(bos_id, ""),
                   eos_token=name.get(eos_id, ""))

    def to_json(self) -> str:
        """Everything needed to rebuild this tokenizer (what the weight cache stores beside the tensors)."""
        return json.dumps(dict(backend=self.backend.to_str(), chat_template=self.chat_template,
                               eos_id=self.eos_id, **self._special))

    @classmethod
    def from_json(cls, text: str) -> BPETokenizer:
        d = json.loads(text)
        return cls(Tokenizer.from_str(d.pop("backend")), **d)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it (e.g. <|im_end|>) become their ids."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a string, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The chat template applied to `messages` ([{"role": ..., "content": ...}, ...]), as text."""
        if self.chat_template is None:
            raise ValueError("messages: this tokenizer's file has no chat template")
        if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
            raise ValueError("messages: expected a non-empty list of {'role': ..., 'content': ...} dicts")
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise ValueError(f"messages[{i}]: expected a dict with string 'role' and 'content', "
                                 f"got {m!r}")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as Hugging Face does

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        try:
            template = env.from_string(self.chat_template)
            return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                   **self._special)
        except jinja2.TemplateError as err:
            raise ValueError(f"chat template: {err}") from None

    def chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat, ending with the assistant's turn opening by default."""
        return self.encode(self.render_chat(messages, add_generation_prompt))
