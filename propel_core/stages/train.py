"""train: GRPO with LoRA on the generator, rewarded by the probe, no solver -> ``RUN/train/``.

The policy is the generator model with LoRA adapters on the configured projections; the probe reads a
separate, frozen copy of the reference model, so the reward depends on the task text alone (paper
3.3). Writes the adapter (``train/adapter/``), checkpoints every ``train.checkpoint_every`` steps,
TRL's metrics (``train/log.jsonl``) and the scorer's per-step diagnostics (``train/reward_log.jsonl``).
Multi-GPU: ``accelerate launch -m propel_core.cli train CONFIG`` with the same config.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from propel_core.backend import prefill, prompt_text
from propel_core.config import ModelConfig, TrainConfig
from propel_core.embedded import resolve_model
from propel_core.errors import PropelError
from propel_core.probes import load_probe
from propel_core.replay import ReplayBuffer, replaying
from propel_core.reward import RewardScorer, reads_probe
from propel_core.run import Run, log


def train(run: Run) -> None:
    """GRPO + LoRA on the generator with the probe reward -> train/ (adapter, logs)."""
    train_generator(run, run.dir / "train")


def train_generator(run: Run, folder: Path) -> None:
    """GRPO + LoRA on the generator with the configured reward rule and probes -> ``folder``."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    config, train_config = run.config, run.config.train
    bundle = Path(config.reward.main_probe) if config.reward.main_probe else run.dir / "probes" / "selected"
    uses_probe = reads_probe(run.component("reward_rules", config.reward.rule)(config.reward))
    if uses_probe and not (bundle / "probe.json").exists():
        raise PropelError(f"no probe bundle in {bundle}: run `propel probe` first")
    generation_batch = train_config.per_device_batch * train_config.gradient_accumulation
    if generation_batch % train_config.group_size:
        raise PropelError(
            f"train.per_device_batch x train.gradient_accumulation ({generation_batch}) must be a multiple of "
            f"train.group_size ({train_config.group_size})"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reward_log.jsonl").unlink(missing_ok=True)  # a rerun trains from the base model again
    bundles = [bundle, *config.reward.probes] if uses_probe else []
    probes = [load_probe(path, run.registry) for path in bundles]
    domain = run.domain()
    sampler = run.component("context_samplers", config.generate.context_sampler)(
        domain.contexts(), seed=config.seed, **config.generate.sampler_options
    )
    replay = train_config.replay
    buffer = None
    if replay.strategy != "none":
        buffer = ReplayBuffer(replay.strategy, replay.min_reward, replay.comparison, replay.capacity, config.seed)
    scorer = RewardScorer(run, probes, log_path=folder / "reward_log.jsonl", sampler=sampler, replay=buffer)

    tokenizer, policy, path = load_policy(config.generator)
    dataset = sampled_prompts(sampler, domain.generator_prompt, tokenizer, config.generator.chat_template, path)
    arguments = GRPOConfig(
        output_dir=str(folder),
        max_steps=train_config.steps,
        learning_rate=train_config.lr,
        beta=train_config.beta,
        num_generations=train_config.group_size,
        per_device_train_batch_size=train_config.per_device_batch,
        gradient_accumulation_steps=train_config.gradient_accumulation,
        temperature=train_config.temperature,
        top_p=train_config.top_p,
        top_k=train_config.top_k,
        max_completion_length=train_config.max_completion_length,
        loss_type=train_config.loss_type,
        epsilon=train_config.epsilon_low,
        epsilon_high=train_config.epsilon_high,
        save_steps=train_config.checkpoint_every,
        logging_steps=1,
        report_to=train_config.report_to,
        use_vllm=train_config.use_vllm,
        vllm_mode=train_config.vllm_mode,
        vllm_server_base_url=train_config.vllm_server_base_url,
        use_cpu=not torch.cuda.is_available(),
        seed=config.seed,
        shuffle_dataset=False,  # a shuffle buffer would draw a thousand prompts ahead of the rewards
        disable_tqdm=run.quiet,
    )
    trainer_class = replaying(GRPOTrainer, buffer, replay.slots) if buffer else GRPOTrainer
    trainer = trainer_class(
        model=policy,
        reward_funcs=scorer,
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(train_config),
    )
    prompts_per_step = generation_batch // train_config.group_size
    log.info("GRPO: %d steps, %d prompts x %d generations each", train_config.steps, prompts_per_step,
             train_config.group_size)  # fmt: skip
    train_and_save(trainer, folder)
    rewards = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    print(f"trained {train_config.steps} steps; reward mean first {rewards[0]['reward_mean']:.3f}, "
          f"last {rewards[-1]['reward_mean']:.3f}; adapter in {folder / 'adapter'}")  # fmt: skip


def load_policy(model: ModelConfig):
    """The tokenizer and model of a role to be trained, and the path they came from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model.model)
    tokenizer = AutoTokenizer.from_pretrained(path, revision=model.revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, AutoModelForCausalLM.from_pretrained(path, revision=model.revision), str(path)


def lora_config(train_config: TrainConfig):
    """The LoRA adapter of ``train.lora_*``, for the generator and the solver alike."""
    from peft import LoraConfig

    return LoraConfig(r=train_config.lora_r, lora_alpha=train_config.lora_alpha,
                      lora_dropout=train_config.lora_dropout, target_modules=train_config.lora_target_modules,
                      task_type="CAUSAL_LM")  # fmt: skip


def sampled_prompts(sampler, messages_of, tokenizer, chat_template: bool, model_id: str):
    """An endless dataset of prompts for a TRL trainer, each context drawn from ``sampler`` when the
    trainer asks for the next batch, so a sampler that learns from the last step's rewards
    (``progress``) shapes the next one. Prompts are the exact text the policy reads (TRL would close a
    prefilled assistant message and open a new turn); ``prefill`` and ``context_id`` ride along for
    the reward function."""
    from datasets import IterableDataset
    from datasets.iterable_dataset import ExamplesIterable

    def rows():
        for index in itertools.count():
            (context,) = sampler.sample(1)
            messages = messages_of(context)
            text = prompt_text(tokenizer, messages, chat_template, model_id)
            yield index, {"prompt": text, "prefill": prefill(messages), "context_id": context.id}

    return IterableDataset(ExamplesIterable(rows, {}))  # (from_generator would try to hash the sampler)


def train_and_save(trainer, folder: Path) -> None:
    """Run a TRL trainer, save its LoRA adapter to ``folder/adapter`` and its metrics to ``log.jsonl``."""
    trainer.train()
    trainer.save_model(str(folder / "adapter"))
    with (folder / "log.jsonl").open("w") as handle:
        for entry in trainer.state.log_history:
            handle.write(json.dumps(entry) + "\n")
