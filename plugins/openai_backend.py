"""The ``openai`` model backend: any OpenAI-compatible HTTP endpoint (a vLLM or SGLang server, a
hosted API) as a generator, solver or oracle.

Requests run concurrently (``max_concurrency``); a rate limit (429), a server error (5xx) or a broken
connection is retried ``max_retries`` times with exponential backoff; any other error stops with the
server's message. It serves text only: the reference model, which must give hidden states, needs the
``transformers`` (or ``vllm``) backend.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from propel_core import hookimpl
from propel_core.backend import HiddenStates, Prompt, as_messages, prefill
from propel_core.config import ModelConfig, Sampling
from propel_core.errors import PropelError

RETRIED = {429, 500, 502, 503, 504}


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
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | None = None
    ) -> list[list[str]]:
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            return list(pool.map(lambda prompt: self._complete(prompt, sampling, n, seed), prompts))

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        raise PropelError(
            "an OpenAI-compatible endpoint returns text, not hidden states: give the reference model the "
            "transformers backend"
        )

    def _complete(self, prompt: Prompt, sampling: Sampling, n: int, seed: int | None) -> list[str]:
        body: dict[str, Any] = {"model": self.model_id, "n": n, "max_tokens": sampling.max_new_tokens,
                                "temperature": sampling.temperature, "top_p": sampling.top_p}  # fmt: skip
        if sampling.top_k:
            body["top_k"] = sampling.top_k  # a vLLM / SGLang extension; hosted APIs may ignore it
        if seed is not None:
            body["seed"] = seed
        if isinstance(prompt, str) and not self.config.chat_template:
            choices = self._post("/completions", body | {"prompt": prompt})
            return [choice["text"] for choice in choices]
        messages = as_messages(prompt)
        if prefill(prompt):  # continue the final assistant message (vLLM's chat extension)
            body |= {"continue_final_message": True, "add_generation_prompt": False}
        choices = self._post("/chat/completions", body | {"messages": messages})
        return [choice["message"]["content"] for choice in choices]

    def _post(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        for attempt in range(self.config.max_retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    choices = json.loads(response.read())["choices"]
                return sorted(choices, key=lambda choice: choice.get("index", 0))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                if exc.code not in RETRIED or attempt == self.config.max_retries:
                    raise PropelError(f"{self.url}{path} answered {exc.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.config.max_retries:
                    raise PropelError(f"cannot reach {self.url}{path}: {exc}") from None
            time.sleep(min(30.0, 0.5 * 2**attempt))
        raise AssertionError("unreachable")
