"""The ``vllm`` model backend: generation and K-sample labeling through vLLM's offline engine.

Install with ``pip install 'propel-core[vllm]'`` on a CUDA machine. One request carries all K
samples of a prompt (``SamplingParams(n=K)``), and vLLM batches every prompt of a call. It serves text
only: the reference model, which must give hidden states, keeps the ``transformers`` backend.
"""

from __future__ import annotations

from propel_core import hookimpl
from propel_core.backend import HiddenStates, Prompt, as_messages, as_text, prefill
from propel_core.config import ModelConfig, Sampling
from propel_core.embedded import resolve_model
from propel_core.errors import PropelError


@hookimpl
def register_model_backends(register):
    register("vllm", VLLMBackend)


class VLLMBackend:
    def __init__(self, model: ModelConfig):
        try:
            from vllm import LLM
        except ImportError:
            raise PropelError(
                "the vllm backend needs vLLM: pip install 'propel-core[vllm]' on a machine with a CUDA GPU, "
                "or use backend: transformers"
            ) from None
        self.config = model
        self.model_id = model.model_id
        self.llm = LLM(
            model=resolve_model(model.model),
            revision=model.revision,
            dtype=model.dtype,
            enable_lora=model.adapter is not None,
        )
        self.lora = None
        if model.adapter:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, model.adapter)

    def generate(
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | list[int] | None = None
    ) -> list[list[str]]:
        """One request per prompt, each with its own seed (``seed[i]``, or ``seed`` for all)."""
        from vllm import SamplingParams

        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_new_tokens,
                seed=one,
            )
            for one in seeds
        ]
        results: list[list[str] | None] = [None] * len(prompts)
        if not self.config.chat_template:
            texts = [as_text(p) for p in prompts]
            for i, output in enumerate(self.llm.generate(texts, params, use_tqdm=False, lora_request=self.lora)):
                results[i] = [completion.text for completion in output.outputs]
            return results
        # prefilled and fresh conversations differ in one engine flag, so they go as two calls
        for continuing in (False, True):
            chosen = [i for i, p in enumerate(prompts) if bool(prefill(p)) == continuing]
            if not chosen:
                continue
            conversations = [as_messages(prompts[i]) for i in chosen]
            outputs = self.llm.chat(
                conversations,
                [params[i] for i in chosen],
                use_tqdm=False,
                add_generation_prompt=not continuing,
                continue_final_message=continuing,
                lora_request=self.lora,
            )
            for i, output in zip(chosen, outputs, strict=True):
                results[i] = [completion.text for completion in output.outputs]
        return results

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        raise PropelError(
            "the vllm backend returns text, not per-layer hidden states: give the reference model the "
            "transformers backend"
        )
