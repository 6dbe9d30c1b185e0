"""The contract between stages and model backends (transformers, vLLM, OpenAI-compatible, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from propel_core.config import Sampling
from propel_core.errors import PropelError

if TYPE_CHECKING:
    import torch

#: a prompt is either plain text or chat messages ([{"role": ..., "content": ...}, ...]); chat messages
#: ending with an assistant message are a prefill: the model continues that message
Prompt = str | list[dict[str, str]]


def as_messages(prompt: Prompt) -> list[dict[str, str]]:
    """The prompt as chat messages: plain text becomes one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def as_text(prompt: Prompt) -> str:
    """The prompt as plain text, for models used without a chat template."""
    return prompt if isinstance(prompt, str) else "\n\n".join(message["content"] for message in prompt)


def prefill(prompt: Prompt) -> str:
    """The start of the answer a prompt prefills ('' when it opens a fresh assistant turn)."""
    if isinstance(prompt, list) and prompt and prompt[-1]["role"] == "assistant":
        return prompt[-1]["content"]
    return ""


def prompt_text(tokenizer, prompt: Prompt, chat_template: bool, model_id: str) -> str:
    """The exact text a Hugging Face model is fed for ``prompt``: its chat template applied (a
    prefilled answer start is continued, not closed), or the plain text when ``chat_template`` is off."""
    if not chat_template:
        return as_text(prompt)
    if tokenizer.chat_template is None:
        raise PropelError(f"model {model_id!r} has no chat template; set chat_template: false for this role")
    messages = as_messages(prompt)
    if prefill(prompt):
        return tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@dataclass
class HiddenStates:
    """Hidden states of a right-padded batch: ``layers[L]`` is ``Tensor[B, T, D]``, ``mask`` ``[B, T]``.

    Layer 0 is the embedding output and layer L the output of decoder block L (Hugging Face's
    ``hidden_states`` numbering), before any final norm.
    """

    layers: dict[int, torch.Tensor]
    mask: torch.Tensor


class ModelBackend(Protocol):
    model_id: str

    def generate(
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | list[int] | None = None
    ) -> list[list[str]]:
        """``n`` completions for each prompt with ``sampling`` (one batched call, not ``n`` calls).

        ``seed`` seeds every prompt alike, or, as a list, prompt ``i`` with ``seed[i]``; a prompt's
        completions must depend on its own seed only, never on the other prompts of the call (the
        executors batch the turns of unrelated jobs). Sampling is always the caller's: one backend
        instance serves every role that names its model.
        """

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        """One forward pass over ``texts``; blocks above ``max(layers)`` are not run."""
