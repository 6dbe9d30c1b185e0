"""Training with TRL: the generator against its reward (GRPO + LoRA) and what the solver's training shares.

:func:`train_generator` is the one GRPO loop of the train stage, co-evolution and the frontier-shift
experiment; they differ only in the values they pass (reward rule and probes, seed, folder).
:func:`load_policy`, :func:`lora_config`, :func:`sampled_prompts` and :func:`train_and_save` serve the
solver's training (``solve-train``, ``self-train``) as well. Multi-turn domains roll out whole episodes
(:class:`EpisodeRollouts`).
"""

from __future__ import annotations

import itertools
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

from propel_core.backend import prefill, prompt_text
from propel_core.config import ModelConfig, RewardConfig, TrainConfig
from propel_core.embedded import resolve_model
from propel_core.errors import PropelError
from propel_core.records import Context, Label, Task
from propel_core.replay import ReplayBuffer, replaying
from propel_core.reward import COMPLETIONS, main_probe, reward_scorer
from propel_core.run import Run, log

# TRL reads ``model.is_gradient_checkpointing`` itself (trl/models/utils.py), which newer transformers
# renamed and warns about at every step; nothing a caller passes avoids it, so only that one is hidden
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def train_generator(
    run: Run,
    folder: Path,
    generator: ModelConfig,
    train_config: TrainConfig,
    reward: RewardConfig,
    seed: int,
    solve: Callable[[list[Task]], list[Label]] | None = None,
    resume: bool = False,
) -> None:
    """GRPO + LoRA on ``generator`` with the reward rule and probes of ``reward`` -> ``folder``
    (``adapter/``, ``log.jsonl``, ``reward_log.jsonl``). ``seed`` seeds the context sampler and the
    trainer; ``solve`` labels tasks with live solver runs, for a rule that needs ``solver_utility``. With
    ``resume``, training goes on from the folder's last checkpoint (the policy's adapter, optimizer,
    schedule and random state; the reward log keeps the steps before it), else starts over."""
    from trl import GRPOConfig, GRPOTrainer

    domain = run.domain()
    if not domain.uses_generator_model:
        raise PropelError(
            f"domain {domain.name!r} writes its tasks with no model (its generator is a program, "
            "e.g. swe's generator: procedural): there is no generator model to train"
        )
    generation_batch = train_config.per_device_batch * train_config.gradient_accumulation
    if generation_batch % train_config.group_size:
        raise PropelError(
            f"train.per_device_batch x train.gradient_accumulation ({generation_batch}) must be a multiple of "
            f"train.group_size ({train_config.group_size})"
        )
    replay = train_config.replay
    if domain.multi_turn and replay.strategy != "none":
        raise PropelError("train.replay works with single-turn domains; set train.replay.strategy: none")
    buffer = ReplayBuffer.of(replay, seed)
    trainer_class = replaying(GRPOTrainer, buffer, replay.slots) if buffer else GRPOTrainer  # checks TRL's shape
    sampler = run.context_sampler(seed)
    scorer = reward_scorer(run, reward, train_config, main_probe(run, reward), solve, sampler=sampler, replay=buffer)
    checkpoint = prepare_folder(folder, resume)
    scorer.log_path = folder / "reward_log.jsonl"
    for log_path in (scorer.log_path, folder / COMPLETIONS):
        keep_steps_before(log_path, step_of(checkpoint))

    tokenizer, policy, path = load_policy(generator)
    contexts_by_prompt: dict[str, Context] = {}
    dataset = sampled_prompts(
        sampler, domain.generator_prompt, tokenizer, generator.chat_template, path, contexts_by_prompt
    )
    arguments = trainer_arguments(
        GRPOConfig,
        run,
        folder,
        run.dir.name,
        steps=train_config.steps,
        lr=train_config.lr,
        batch=train_config.per_device_batch,
        seed=seed,
        beta=train_config.beta,
        num_generations=train_config.group_size,
        gradient_accumulation_steps=train_config.gradient_accumulation,
        temperature=train_config.temperature,
        top_p=train_config.top_p,
        top_k=train_config.top_k,
        max_completion_length=train_config.max_completion_length,
        loss_type=train_config.loss_type,
        mask_truncated_completions=train_config.mask_truncated_completions,
        **{checkpointing_argument(GRPOConfig): train_config.gradient_checkpointing},
        epsilon=train_config.epsilon_low,
        epsilon_high=train_config.epsilon_high,
        save_steps=train_config.checkpoint_every,
        use_vllm=train_config.use_vllm,
        vllm_mode=train_config.vllm_mode,
        vllm_server_base_url=train_config.vllm_server_base_url,
        shuffle_dataset=False,  # a shuffle buffer would draw a thousand prompts ahead of the rewards
    )
    multi_turn = {"rollout_func": EpisodeRollouts(domain, tokenizer, contexts_by_prompt, train_config, seed)}
    reward_funcs = [scorer]
    if train_config.overlong_buffer:
        from trl.rewards import get_soft_overlong_punishment

        reward_funcs.append(
            get_soft_overlong_punishment(train_config.max_completion_length, train_config.overlong_buffer)
        )
    trainer = trainer_class(
        model=policy,
        reward_funcs=reward_funcs,
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(train_config),
        **(multi_turn if domain.multi_turn else {}),
    )
    prompts_per_step = generation_batch // train_config.group_size
    log.info(
        "GRPO: %d steps, %d prompts x %d generations each",
        train_config.steps,
        prompts_per_step,
        train_config.group_size,
    )
    train_and_save(trainer, folder, checkpoint)
    rewards = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    run.say(
        f"trained {train_config.steps} steps; reward mean first {rewards[0]['reward_mean']:.3f}, "
        f"last {rewards[-1]['reward_mean']:.3f}; adapter in {folder / 'adapter'}"
    )


def trainer_arguments(
    config_class: type, run: Run, folder: Path, name: str, *, steps: int, lr: float, batch: int, seed: int, **own
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
        **run.tracker.trainer_arguments(name),
        use_cpu=not torch.cuda.is_available(),
        seed=seed,
        disable_tqdm=run.quiet,
        **own,
    )


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

    return LoraConfig(
        r=train_config.lora_r,
        lora_alpha=train_config.lora_alpha,
        lora_dropout=train_config.lora_dropout,
        target_modules=train_config.lora_target_modules,
        task_type="CAUSAL_LM",
    )


def sampled_prompts(sampler, messages_of, tokenizer, chat_template: bool, model_id: str, seen=None):
    """An endless dataset of prompts for a TRL trainer, each context drawn from ``sampler`` when the
    trainer asks for the next batch, so a sampler that learns from the last step's rewards
    (``progress``) shapes the next one. Prompts are the exact text the policy reads (TRL would close a
    prefilled assistant message and open a new turn); ``prefill`` and ``context_id`` ride along for
    the reward function; ``seen`` (when given) maps each prompt to its context, for multi-turn rollouts."""
    from datasets import IterableDataset
    from datasets.iterable_dataset import ExamplesIterable

    def rows():
        for index in itertools.count():
            (context,) = sampler.sample(1)
            messages = messages_of(context)
            text = prompt_text(tokenizer, messages, chat_template, model_id)
            if seen is not None:
                seen[text] = context
            yield index, {"prompt": text, "prefill": prefill(messages), "context_id": context.id}

    return IterableDataset(ExamplesIterable(rows, {}))  # (from_generator would try to hash the sampler)


class EpisodeRollouts:
    """TRL's ``rollout_func`` for multi-turn domains: each prompt becomes one episode of the domain
    (an agent acting in its sandbox), with the policy answering every turn.

    The completion is the whole trajectory in tokens: the policy's turns (``env_mask`` 1, trained)
    and the tool results between them, in the chat template's framing (``env_mask`` 0, not trained).
    The episode's trajectory text rides along as ``generation`` for the reward function, which
    parses and verifies it and has the probe read the finished trajectory. Once the trajectory
    reaches ``train.max_completion_length`` tokens the policy is not asked again; the reward scorer
    gives such an episode ``reward.overflow_reward``.
    """

    def __init__(self, domain, tokenizer, contexts_by_prompt: dict[str, Context], train_config: TrainConfig, seed):
        self.domain, self.tokenizer, self.contexts = domain, tokenizer, contexts_by_prompt
        self.config, self.seed, self.calls = train_config, seed, 0

    def __call__(self, prompts: list[str], trainer) -> dict:
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "generation": []}
        for prompt in prompts:
            self.calls += 1
            turns = TokenTurns(unwrapped, self.tokenizer, prompt, self.config)
            generation = self.domain.episode(self.contexts[prompt], turns.reply, self.seed + self.calls)
            out["prompt_ids"].append(turns.prompt_ids)
            out["completion_ids"].append(turns.completion_ids)
            out["env_mask"].append(turns.env_mask)
            out["generation"].append(generation)
        out["logprobs"] = None
        return out


class TokenTurns:
    """A ``Reply`` that samples each turn from a Hugging Face model and keeps the token sequence."""

    def __init__(self, model, tokenizer, prompt: str, config: TrainConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        self.completion_ids: list[int] = []
        self.env_mask: list[int] = []

    def reply(self, messages: list[dict[str, str]]) -> str:
        import torch

        if self.completion_ids:  # the tool results since the last turn, framed as the chat template frames them
            self._extend(self._between(messages), trained=False)
        room = self.config.max_completion_length - len(self.completion_ids)
        if room <= 0:
            return "```"  # an unfinished call: the episode ends with stop reason `length`
        config = self.config
        ids = torch.tensor([self.prompt_ids + self.completion_ids], device=self.model.device)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k,
                max_new_tokens=min(config.max_turn_tokens, room),
                pad_token_id=self.tokenizer.pad_token_id,
                use_cache=True,
            )
        self.model.train(was_training)
        new = out[0, ids.shape[1] :].tolist()
        self._extend(new, trained=True)
        return self.tokenizer.decode(new, skip_special_tokens=True)

    def _between(self, messages: list[dict[str, str]]) -> list[int]:
        """Tokens that close the last assistant turn and frame the messages after it, up to the next
        assistant turn's opening."""
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        before = self.tokenizer.apply_chat_template(messages[: last + 1], tokenize=False)
        after = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        closing = before[before.rindex(messages[last]["content"]) + len(messages[last]["content"]) :]
        eos = self.tokenizer.eos_token or ""
        if self.completion_ids and self.completion_ids[-1] == self.tokenizer.eos_token_id:
            closing = closing.removeprefix(eos)
        return self.tokenizer(closing + after[len(before) :], add_special_tokens=False)["input_ids"]

    def _extend(self, ids: list[int], trained: bool) -> None:
        self.completion_ids += ids
        self.env_mask += [int(trained)] * len(ids)


def last_checkpoint(folder: Path) -> Path | None:
    """The folder's checkpoint of the most steps (TRL's ``checkpoint-N``), if any."""
    found = [
        path
        for path in Path(folder).glob("checkpoint-*")
        if path.name.split("-")[-1].isdigit() and (path / "trainer_state.json").exists()  # saved whole
    ]
    return max(found, key=step_of, default=None)


def checkpointing_argument(config_class) -> str:
    """The training argument that turns activation checkpointing on: ``activation_checkpointing`` where
    transformers has it (its old name ``gradient_checkpointing`` warns on every run there)."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def step_of(checkpoint: Path | None) -> int:
    """The optimizer steps a checkpoint was saved after (0 for none)."""
    return int(checkpoint.name.split("-")[-1]) if checkpoint is not None else 0


def goes_on(folder: Path, resume: bool) -> bool:
    """Whether a training into ``folder`` adds to what is there (for ``Run.claim``): resuming, and the
    folder holds a checkpoint or a finished adapter (its checkpoints removed to free the disk)."""
    return resume and (last_checkpoint(folder) is not None or (folder / "adapter").exists())


def prepare_folder(folder: Path, resume: bool) -> Path | None:
    """The checkpoint a training run goes on from (``resume`` and the folder has one); starting over,
    the old checkpoints, adapter and logs are removed first, so no later resume picks up a checkpoint of
    another run and nothing reads an old adapter as the new training's while it runs (or after it
    failed)."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = last_checkpoint(folder) if resume else None
    if checkpoint is None:
        for old in [*folder.glob("checkpoint-*"), folder / "adapter"]:
            shutil.rmtree(old, ignore_errors=True)
        for log_path in ("log.jsonl", "reward_log.jsonl", COMPLETIONS, "rollouts.jsonl"):
            (folder / log_path).unlink(missing_ok=True)
    return checkpoint


def keep_steps_before(log_path: Path, step: int) -> None:
    """Drop a per-step log's entries (the reward log, the completions) of steps a resumed run will redo
    (``step`` and later)."""
    if not log_path.exists():
        return
    kept = []
    for line in log_path.read_text().splitlines():
        try:
            if json.loads(line)["step"] < step:
                kept.append(line)
        except (ValueError, KeyError):  # a line torn by the kill
            continue
    log_path.write_text("".join(line + "\n" for line in kept))


def train_and_save(trainer, folder: Path, checkpoint: Path | None = None) -> None:
    """Run a TRL trainer (from ``checkpoint`` when given), save its LoRA adapter to ``folder/adapter``
    and its metrics to ``log.jsonl``. A checkpoint at the last step is the result itself: nothing
    trains again, its adapter and log are kept."""
    if checkpoint is not None and step_of(checkpoint) >= trainer.args.max_steps:
        log.info("%s is at the last step (%d): nothing to train", checkpoint, trainer.args.max_steps)
        shutil.rmtree(folder / "adapter", ignore_errors=True)
        (folder / "adapter").mkdir()
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy(checkpoint / name, folder / "adapter" / name)
        history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    else:
        if checkpoint is not None:
            log.info("resuming from %s (train.resume: false starts over)", checkpoint)
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        trainer.save_model(str(folder / "adapter"))
        history = trainer.state.log_history
    with (folder / "log.jsonl").open("w") as handle:
        for entry in history:
            handle.write(json.dumps(entry) + "\n")
