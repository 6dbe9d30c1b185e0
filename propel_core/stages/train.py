"""train: GRPO with LoRA on the generator, rewarded by the probe, no solver -> ``RUN/train/``.

The policy is the generator model with LoRA adapters on the configured projections; the probe reads a
separate, frozen copy of the reference model, so the reward depends on the task text alone (paper
3.3). Writes the adapter (``train/adapter/``), checkpoints every ``train.checkpoint_every`` steps,
TRL's metrics (``train/log.jsonl``) and the scorer's per-step diagnostics (``train/reward_log.jsonl``).
Multi-GPU: ``accelerate launch -m propel_core.cli train CONFIG`` with the same config.
"""

from __future__ import annotations

import json

from propel_core.embedded import resolve_model
from propel_core.errors import PropelError
from propel_core.probes import load_probe
from propel_core.reward import RewardScorer, reads_probe
from propel_core.run import Run, log


def train(run: Run) -> None:
    """GRPO + LoRA on the generator with the probe reward -> train/ (adapter, logs)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    config, train_config = run.config, run.config.train
    bundle = run.dir / "probes" / "selected"
    uses_probe = reads_probe(run.component("reward_rules", config.reward.rule)(config.reward))
    if uses_probe and not (bundle / "probe.json").exists():
        raise PropelError(f"no probe bundle in {bundle}: run `propel probe` first")
    generation_batch = train_config.per_device_batch * train_config.gradient_accumulation
    if generation_batch % train_config.group_size:
        raise PropelError(
            f"train.per_device_batch x train.gradient_accumulation ({generation_batch}) must be a multiple of "
            f"train.group_size ({train_config.group_size})"
        )
    folder = run.dir / "train"
    folder.mkdir(parents=True, exist_ok=True)
    bundles = [bundle, *config.reward.probes] if uses_probe else []
    probes = [load_probe(path, run.registry) for path in bundles]
    scorer = RewardScorer(run, probes, log_path=folder / "reward_log.jsonl")

    domain = run.domain()
    sampler = run.component("context_samplers", config.generate.context_sampler)(
        domain.contexts(), seed=config.seed, **config.generate.sampler_options
    )
    prompts_needed = max(1, train_config.steps * generation_batch // train_config.group_size)
    contexts = sampler.sample(prompts_needed)
    dataset = Dataset.from_list([{"prompt": domain.generator_prompt(c), "context_id": c.id} for c in contexts])

    path = resolve_model(config.generator.model)
    tokenizer = AutoTokenizer.from_pretrained(path, revision=config.generator.revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy = AutoModelForCausalLM.from_pretrained(path, revision=config.generator.revision)
    lora = LoraConfig(
        r=train_config.lora_r,
        lora_alpha=train_config.lora_alpha,
        lora_dropout=train_config.lora_dropout,
        target_modules=train_config.lora_target_modules,
        task_type="CAUSAL_LM",
    )
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
        use_cpu=not torch.cuda.is_available(),
        seed=config.seed,
        disable_tqdm=run.quiet,
    )
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=scorer,
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )
    log.info("GRPO: %d steps, %d prompts x %d generations", train_config.steps, len(dataset), train_config.group_size)
    trainer.train()
    trainer.save_model(str(folder / "adapter"))
    with (folder / "log.jsonl").open("w") as handle:
        for entry in trainer.state.log_history:
            handle.write(json.dumps(entry) + "\n")
    rewards = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    print(f"trained {train_config.steps} steps; reward mean first {rewards[0]['reward_mean']:.3f}, "
          f"last {rewards[-1]['reward_mean']:.3f}; adapter in {folder / 'adapter'}")  # fmt: skip
