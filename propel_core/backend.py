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


class Completion(str):
    """A completion's text that knows whether the length limit cut it off (``cut_off``) instead of
    the model ending it (an end-of-sequence token or a stop string). A backend that cannot tell
    returns plain strings, which count as finished."""

    cut_off: bool

    def __new__(cls, text: str, cut_off: bool) -> Completion:
        completion = super().__new__(cls, text)
        completion.cut_off = cut_off
        return completion

    def __reduce__(self):
        return Completion, (str(self), self.cut_off)


def was_cut_off(text: str) -> bool:
    """Whether ``text`` is a completion the length limit cut off."""
    return isinstance(text, Completion) and text.cut_off


def before_stop(text: str, stop: list[str]) -> str:
    """``text`` up to the first of the ``stop`` strings it holds (the stop string left out, as vLLM
    and OpenAI-compatible servers leave it out); all of it where it holds none."""
    ends = [found for found in (text.find(s) for s in stop) if found >= 0]
    return text[: min(ends)] if ends else text


def end_tokens(tokenizer, generation_config) -> set[int]:
    """The tokens a Hugging Face model's generated row ends with, or is padded with once it ended."""
    eos = generation_config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    return ends - {None}


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

        A completion ends at the first of ``sampling.stop`` it writes, which it does not include; one
        the ``sampling.max_new_tokens`` limit ended is a :class:`Completion` with ``cut_off`` set.
        """

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        """One forward pass over ``texts``; blocks above ``max(layers)`` are not run."""
