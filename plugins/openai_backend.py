"""The ``openai`` model backend: any OpenAI-compatible HTTP endpoint (a vLLM or SGLang server, a
hosted API) as a generator, solver or oracle.

Requests run concurrently (``max_concurrency``); a rate limit (429), a server error (5xx) or a broken
connection is retried ``max_retries`` times, after the wait the server asks for (``Retry-After``, in
seconds or as a date, at most MAX_WAIT) or else with exponential backoff; any other error stops with the
server's message. A server that returns fewer choices than ``n`` is asked again for the rest (with
other seeds); one that returns none stops the run, so a label never holds fewer than K attempts.
vLLM's and SGLang's request extensions (``top_k``, continuing a prefilled assistant message) are sent
only with ``server_extensions: true``; without them a prefill is asked for in words. It serves text
only: the reference model, which must give hidden states, needs the ``transformers`` (or ``vllm``)
backend.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from propel_core import (
    Completion,
    HiddenStates,
    ModelConfig,
    Prompt,
    PropelError,
    Sampling,
    as_messages,
    hookimpl,
    prefill,
)

RETRIED = {429, 500, 502, 503, 504}
#: request fields only vLLM-like servers accept
EXTENSIONS = frozenset({"top_k", "continue_final_message", "add_generation_prompt"})
#: without server extensions, a prefilled answer start becomes this request at the end of the user turn
PREFILL_REQUEST = "Begin your reply with exactly: {start}"


@hookimpl
def register_model_backends(register):
    register("openai", OpenAIBackend)


class OpenAIBackend:
    def __init__(self, model: ModelConfig, timeout: float = 600.0):
        if not model.base_url:
            raise PropelError("the openai backend needs base_url, e.g. http://localhost:8000/v1")
        if model.model is None:
            raise PropelError("the openai backend needs model: the name the endpoint serves")
        if model.adapter:
            raise PropelError(
                "the openai backend cannot apply a local adapter: serve it from the endpoint "
                "(e.g. vllm serve --lora-modules) and name it as model"
            )
        self.config, self.model_id, self.timeout = model, model.model, timeout
        self.url = model.base_url.rstrip("/")
        self.api_key = os.environ.get(model.api_key_env)

    def generate(
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | list[int] | None = None
    ) -> list[list[str]]:
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            return list(pool.map(lambda p, s: self._complete(p, sampling, n, s), prompts, seeds))

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        raise PropelError(
            "an OpenAI-compatible endpoint returns text, not hidden states: give the reference model the "
            "transformers backend"
        )

    def _complete(self, prompt: Prompt, sampling: Sampling, n: int, seed: int | None) -> list[str]:
        """``n`` completions of one prompt, asking again while the server returns fewer."""
        texts: list[str] = []
        while len(texts) < n:
            more = self._request(prompt, sampling, n - len(texts), None if seed is None else seed + len(texts))
            if not more:
                raise PropelError(f"{self.url} returned no choices for a request of n={n - len(texts)}")
            texts += more
        return texts

    def _request(self, prompt: Prompt, sampling: Sampling, n: int, seed: int | None) -> list[str]:
        extensions = self.config.server_extensions
        body: dict[str, Any] = {
            "model": self.model_id,
            "n": n,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.top_k and extensions:
            body["top_k"] = sampling.top_k
        if seed is not None:
            body["seed"] = seed
        if sampling.stop:
            body["stop"] = sampling.stop
        if isinstance(prompt, str) and not self.config.chat_template:
            choices = self._post("/completions", body | {"prompt": prompt})
            return [_completion(choice["text"], choice) for choice in choices]
        messages, start = as_messages(prompt), prefill(prompt)
        if start and extensions:  # continue the final assistant message (vLLM's and SGLang's chat extension)
            body |= {"continue_final_message": True, "add_generation_prompt": False}
        elif start:  # a standard server opens a new reply: ask for the start in words, strip it if echoed
            request = messages[-2]["content"] if len(messages) > 1 and messages[-2]["role"] == "user" else ""
            messages = [
                *messages[:-2],
                {"role": "user", "content": f"{request}\n\n{PREFILL_REQUEST.format(start=start)}"},
            ]
        choices = self._post("/chat/completions", body | {"messages": messages})
        texts = [choice["message"]["content"] or "" for choice in choices]
        if start and not extensions:
            texts = [text.lstrip()[len(start) :] if text.lstrip().startswith(start) else text for text in texts]
        return [_completion(text, choice) for text, choice in zip(texts, choices, strict=True)]

    def _post(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        for attempt in range(self.config.max_retries + 1):
            wait = backoff(attempt)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    choices = json.loads(response.read())["choices"]
                return sorted(choices, key=lambda choice: choice.get("index", 0))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                if exc.code == 422 and self.config.server_extensions and EXTENSIONS & set(body):
                    raise PropelError(
                        f"{self.url}{path} refused the request ({exc.code}: {detail}); it may not accept vLLM's "
                        f"extensions ({', '.join(sorted(EXTENSIONS & set(body)))}): set server_extensions: false "
                        "for this model"
                    ) from None
                if exc.code not in RETRIED or attempt == self.config.max_retries:
                    raise PropelError(f"{self.url}{path} answered {exc.code}: {detail}") from None
                wait = retry_after(exc.headers.get("Retry-After")) if exc.headers else None
                wait = backoff(attempt) if wait is None else wait
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.config.max_retries:
                    raise PropelError(f"cannot reach {self.url}{path}: {exc}") from None
            time.sleep(wait)
        raise AssertionError("unreachable")


#: the longest wait a ``Retry-After`` header gets honoured with
MAX_WAIT = 300.0


def backoff(attempt: int) -> float:
    """The wait before retry ``attempt + 1`` when the server names none: 0.5 s doubling, at most 30 s."""
    return min(30.0, 0.5 * 2**attempt)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (delay seconds or an HTTP date), at most
    MAX_WAIT; None when there is no header or it cannot be read."""
    from email.utils import parsedate_to_datetime

    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(MAX_WAIT, float(value))
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return min(MAX_WAIT, max(0.0, when - (time.time() if now is None else now)))


def _completion(text: str, choice: dict[str, Any]) -> Completion:
    """A choice's text, saying whether the length limit ended it (``finish_reason``)."""
    return Completion(text, cut_off=choice.get("finish_reason") == "length")
