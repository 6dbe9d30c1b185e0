"""The ``transformers`` model backend: sampling and hidden states with plain Hugging Face models."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from propel_core import (
    Completion,
    HiddenStates,
    ModelConfig,
    Prompt,
    PropelError,
    Sampling,
    before_stop,
    end_tokens,
    hookimpl,
    prompt_text,
    resolve_model,
)

if TYPE_CHECKING:
    import torch


@hookimpl
def register_model_backends(register):
    register("transformers", TransformersBackend)


class TransformersBackend:
    """Loads a causal LM (hub id, local folder, or the embedded default) and runs it in-process."""

    def __init__(self, model: ModelConfig):
        path = resolve_model(model.model)  # a path that is no model fails here, before torch loads (seconds)
        advice = "give a local model folder, a .gguf file or a Hugging Face hub id"
        if Path(path).is_dir() and not (Path(path) / "config.json").exists():
            raise PropelError(f"model {path} is a folder without a config.json, not a model: {advice}")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = model
        self.model_id = model.model_id
        self.device = _pick_device(model.device)
        dtype = _pick_dtype(model.dtype, self.device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, revision=model.revision)
            self.model = AutoModelForCausalLM.from_pretrained(path, revision=model.revision, dtype=dtype)
        except OSError as exc:  # an unknown hub id, no network, a broken folder: one line, not a traceback
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PropelError(f"cannot load model {path}: {reason} ({advice})") from None
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if model.adapter:  # merged once: sampling then runs at the base model's speed
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, model.adapter).merge_and_unload()
        self.model.to(self.device).eval()
        self.num_layers = self.model.config.num_hidden_layers
        #: whether rows of one call with the same prompt share one prompt pass (``_generate_rows``): for a
        #: float32 model on the CPU, where it pays (1.47x on a label batch) and samples exactly what a
        #: pass per row samples. Not on a GPU, where it measured no faster (1.04x in bfloat16, 0.87x in
        #: float32 on an H100), nor in half precision, where the other matrix shapes round otherwise
        #: (31% of greedy rows changed): benchmarks/cuda.py. Benchmarks and tests set it to compare.
        self._share_prefill = self.device == "cpu" and self.model.dtype == torch.float32
        #: held while the model runs: hidden_states cuts its blocks for a while, and callers in other
        #: threads (the audit's solver beside the probe's reward) may share this backend
        self._in_use = threading.Lock()

    # -- generation ---------------------------------------------------------------------------------

    def prompt_text(self, prompt: Prompt) -> str:
        """The exact text fed to the model for ``prompt`` (chat template applied when configured)."""
        return prompt_text(self.tokenizer, prompt, self.config.chat_template, self.model_id)

    def generate(
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | list[int] | None = None
    ) -> list[list[str]]:
        """``n`` completions per prompt. Sampled rows each draw from their own random stream, seeded
        ``seed[i] + r`` for completion ``r`` of prompt ``i`` (an int seeds every prompt alike), so a
        completion does not depend on the other prompts in the batch."""
        do_sample = sampling.temperature > 0
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise PropelError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        copies = n if do_sample else 1  # greedy: the n completions are the same one
        texts = [self.prompt_text(p) for p in prompts for _ in range(copies)]
        row_seeds = [None if s is None else s + r for s in seeds for r in range(copies)]
        completions: list[str] = []
        rows_per_call = self.config.batch_size * copies
        for start in range(0, len(texts), rows_per_call):
            # sampled rows are drawn by RowSampler (Gumbel-max), so the greedy step picks them
            processors = [RowSampler(sampling, row_seeds[start : start + rows_per_call])] if do_sample else []
            completions += self._generate_rows(texts[start : start + rows_per_call], sampling, processors)
        if not do_sample:
            return [[text] * n for text in completions]
        return [completions[i : i + n] for i in range(0, len(completions), n)]

    def _generate_rows(self, texts: list[str], sampling: Sampling, processors: list) -> list[str]:
        """One completion per row of ``texts``, in one ``generate`` call. Rows with the same prompt (the
        K attempts at a task) share its prompt pass: each distinct prompt runs once, all but its last
        token, and its KV cache is copied to its rows, which then run the last prompt token and decode
        as before (vLLM's prefix caching, for whole prompts)."""
        import torch
        from transformers import DynamicCache

        number = {text: i for i, text in enumerate(dict.fromkeys(texts))}  # distinct prompts, in order
        batch = self.tokenizer(  # left padding: generation continues from the right edge; set per call, since
            list(number),  # the audit's solver calls and the probe's reward may share a backend across threads
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=not self.config.chat_template,
        )
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        rows = torch.tensor([number[text] for text in texts], device=self.device)
        options = {}
        with self._in_use, torch.inference_mode():
            if len(number) < len(texts) and ids.shape[1] > 1 and self._prefill_can_be_shared():
                cache = DynamicCache(config=self.model.config)
                positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate numbers them
                prompt = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
                start = {k: v[:, :-1] for k, v in prompt.items()}
                self.model.base_model(**start, **{self._cache: cache}, use_cache=True)
                cache.batch_select_indices(rows)
                options[self._cache] = cache  # generate runs only the uncached last token
            if sampling.stop:
                options |= {"stop_strings": sampling.stop, "tokenizer": self.tokenizer}
            out = self.model.generate(
                input_ids=ids[rows],
                attention_mask=mask[rows],
                do_sample=False,
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                logits_processor=processors,
                **options,
            )
        new = out[:, ids.shape[1] :]
        # generation runs until every row has ended, so a shorter batch cut none; at the limit, a row that
        # ended earlier is padded (its last token an end token), and one that stopped holds its stop string
        ending = torch.tensor(sorted(end_tokens(self.tokenizer, self.model.generation_config)), device=new.device)
        ends = torch.isin(new[:, -1], ending).tolist() if new.shape[1] >= sampling.max_new_tokens else None
        completions = []
        for i, text in enumerate(self.tokenizer.batch_decode(new, skip_special_tokens=True)):
            kept = before_stop(text, sampling.stop)
            completions.append(Completion(kept, cut_off=ends is not None and not ends[i] and kept == text))
        return completions

    @property
    def _cache(self) -> str:
        """The name a cache is passed by: ``cache`` where the model's forward takes it (newer
        transformers renamed ``past_key_values``, which warns on every call there), else
        ``past_key_values``."""
        import inspect

        return "cache" if "cache" in inspect.signature(self.model.base_model.forward).parameters else "past_key_values"

    def _prefill_can_be_shared(self) -> bool:
        """Whether rows may continue from a copied ``DynamicCache``: where ``_share_prefill`` asks for
        it, and not for a model whose generation config names another cache, nor for one transformers
        does not give a dynamic cache (xlnet, rwkv, ...)."""
        model = self.model
        return (
            self._share_prefill
            and getattr(model.generation_config, "cache_implementation", None) is None
            and getattr(model, "_supports_default_dynamic_cache", lambda: False)()
        )

    # -- hidden states ------------------------------------------------------------------------------

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        """Under ``torch.inference_mode``, but for a model put in training mode (the ranker's LoRA,
        ``rank.lora``): its states keep their graph, for gradients to flow back into it."""
        import torch

        bad = [layer for layer in layers if not 0 <= layer <= self.num_layers]
        if bad:
            raise PropelError(f"layers {bad} out of range for {self.model_id!r}: it has layers 0..{self.num_layers}")
        base = self.model.base_model
        deepest = max(layers)
        captured: dict[int, torch.Tensor] = {}

        def keep(layer: int):
            def hook(_module, _inputs, output):
                captured[layer] = output[0] if isinstance(output, tuple) else output

            return hook

        batch = self.tokenizer(  # right padding: causal attention, so real tokens never see it
            texts, return_tensors="pt", padding=True, padding_side="right", truncation=True, max_length=max_length
        ).to(self.device)
        with self._in_use:  # the hooks and the cut blocks are the model's own state while they last
            blocks = base.layers  # read under the lock: another caller's cut list must never be kept
            handles = [
                (self.model.get_input_embeddings() if layer == 0 else blocks[layer - 1]).register_forward_hook(
                    keep(layer)
                )
                for layer in set(layers)
            ]
            base.layers = blocks[:deepest]  # blocks above the deepest requested layer are not run at all
            try:
                with torch.inference_mode(not self.model.training):
                    base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            finally:
                base.layers = blocks
                for handle in handles:
                    handle.remove()
        return HiddenStates(layers={layer: captured[layer] for layer in layers}, mask=batch["attention_mask"])


class RowSampler:
    """A logits processor that samples every row from its own ``torch.Generator``: temperature, top-k
    and top-p as usual, then Gumbel noise, so that the greedy step of ``generate`` picks an exact sample
    of the filtered distribution (the Gumbel-max trick). A row's draws do not depend on the batch."""

    def __init__(self, sampling: Sampling, seeds: list[int | None]):
        import torch

        self.sampling = sampling
        self.generators = []
        for seed in seeds:
            generator = torch.Generator()
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
            self.generators.append(generator)

    def __call__(self, input_ids, scores):
        import torch

        scores = scores.float() / self.sampling.temperature
        if self.sampling.top_k:
            kth = torch.topk(scores, min(self.sampling.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.sampling.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True, dim=-1)
            probabilities = ordered.softmax(dim=-1)
            beyond = probabilities.cumsum(dim=-1) - probabilities > self.sampling.top_p  # the nucleus is full
            scores = scores.masked_fill(torch.empty_like(beyond).scatter(-1, order, beyond), float("-inf"))
        uniform = torch.stack([torch.rand(scores.shape[-1], generator=g) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1 - 1e-7)))
        return scores + gumbel.to(scores.device)


def _pick_device(device: str) -> str:
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _pick_dtype(dtype: str, device: str) -> torch.dtype:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)
