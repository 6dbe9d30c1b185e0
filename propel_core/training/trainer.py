"""What every propel training sets up alike: the TRL arguments (one builder for GRPO, RLOO and SFT),
the policy and its LoRA adapter, and the prompts a trainer samples from a context sampler."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

from propel_core.backend import prefill, prompt_text
from propel_core.config import LoraConfig, ModelConfig
from propel_core.embedded import resolve_model
from propel_core.services import Services
from propel_core.worker import traced

# TRL reads ``model.is_gradient_checkpointing`` itself (trl/models/utils.py), which newer transformers
# renamed and warns about at every step; nothing a caller passes avoids it, so only that one is hidden
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def trainer_arguments(
    config_class: type,
    services: Services,
    folder: Path,
    name: str,
    *,
    steps: int,
    lr: float,
    batch: int,
    seed: int,
    **own,
):
    """The TRL config (``config_class``: GRPOConfig, RLOOConfig, SFTConfig) of every propel training:
    what they all set alike (``folder`` for checkpoints, ``steps``, ``lr``, ``batch`` per device,
    ``seed``, a log line every step, the run's trackers under ``name``, the CPU where there is no
    GPU, no bars with ``-q``), then the trainer's ``own`` settings."""
    import torch

    return config_class(
        output_dir=str(folder),
        max_steps=steps,
        learning_rate=lr,
        per_device_train_batch_size=batch,
        logging_steps=1,
        **services.tracker().trainer_arguments(name),
        use_cpu=not torch.cuda.is_available(),
        seed=seed,
        disable_tqdm=services.quiet,
        **own,
    )


def checkpointing_argument(config_class) -> str:
    """The training argument that turns activation checkpointing on: ``activation_checkpointing`` where
    transformers has it (its old name ``gradient_checkpointing`` warns on every run there)."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def load_policy(model: ModelConfig):
    """The tokenizer and model of a role to be trained, and the path they came from. A role with an
    adapter trains that adapter on (loaded trainable; :func:`new_lora` then adds none): a round of
    ``propel rounds`` starts from the round before's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model.model)
    tokenizer = AutoTokenizer.from_pretrained(path, revision=model.revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy = AutoModelForCausalLM.from_pretrained(path, revision=model.revision)
    if model.adapter:
        from peft import PeftModel

        policy = PeftModel.from_pretrained(policy, model.adapter, is_trainable=True)
        for config in policy.peft_config.values():  # written back in one order, as lora_config's are
            config.target_modules = SortedSet(config.target_modules)
    return tokenizer, policy, str(path)


def new_lora(model: ModelConfig, lora: LoraConfig):
    """The LoRA adapter a training of ``model`` adds (:func:`lora_config`): none where the role's own
    adapter trains on."""
    return None if model.adapter else lora_config(lora)


def lora_config(lora: LoraConfig, r: int | None = None, alpha: int | None = None):
    """The LoRA adapter of the ``lora`` section, for every training alike; ``r`` and ``alpha`` in place of
    ``lora.r`` and ``lora.alpha`` where a role sizes its own (``rank.lora_r``, ``rank.lora_alpha``)."""
    from peft import LoraConfig

    config = LoraConfig(
        r=r or lora.r,
        lora_alpha=alpha or lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    config.target_modules = SortedSet(config.target_modules)
    return config


class SortedSet(set):
    """A set that iterates in sorted order. PEFT keeps ``target_modules`` as a set and writes it to
    ``adapter_config.json`` in iteration order, which string hashing changes from process to process;
    in sorted order two runs of one seed write the same adapter bytes."""

    def __iter__(self):
        return iter(sorted(set.__iter__(self)))


def sampled_prompts(sampler, messages_of, tokenizer, chat_template: bool, model_id: str, seen=None):
    """An endless dataset of prompts for a TRL trainer, each context drawn from ``sampler`` when the
    trainer asks for the next batch, so a sampler that learns from the last step's rewards
    (``progress``) shapes the next one. Prompts are the exact text the policy reads (TRL would close a
    prefilled assistant message and open a new turn), with the context's trace where it has one
    (``worker.traced``); ``prefill`` and ``context_id`` ride along for the reward function; ``seen``
    (when given) maps each prompt to its context, for multi-turn rollouts."""
    from datasets import IterableDataset
    from datasets.iterable_dataset import ExamplesIterable

    def rows():
        for index in itertools.count():
            (context,) = sampler.sample(1)
            messages = traced(messages_of(context), context.trace)
            text = prompt_text(tokenizer, messages, chat_template, model_id)
            if seen is not None:
                seen[text] = context
            yield index, {"prompt": text, "prefill": prefill(messages), "context_id": context.id}

    return IterableDataset(ExamplesIterable(rows, {}))  # (from_generator would try to hash the sampler)
