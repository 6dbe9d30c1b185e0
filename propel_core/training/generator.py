"""The generator's GRPO loop: the train stage, co-evolution and the frontier-shift experiment all call
:func:`train_generator`, with their own reward rule, probes, seed and folder. Multi-turn domains roll
out whole episodes (:class:`EpisodeRollouts`)."""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

from propel_core.backend import end_tokens
from propel_core.config import TrainConfig
from propel_core.domain import generation_stop
from propel_core.embedded import model_source
from propel_core.errors import PropelError
from propel_core.execution import solver_labels
from propel_core.plans import GeneratorPlan
from propel_core.ranks import gathered, is_main, process_count, sharded, stopping_together
from propel_core.records import Context
from propel_core.services import Services
from propel_core.training.audit import Audit, audited
from propel_core.training.checkpoints import keep_steps_before, prepare_folder, step_of, train_and_save
from propel_core.training.feedback import logged_steps, reward_never_moved
from propel_core.training.generator_reward import COMPLETIONS, main_probe, reward_scorer
from propel_core.training.pace import Pace
from propel_core.training.replay import ReplayBuffer, replaying
from propel_core.training.trainer import (
    checkpointing_argument,
    load_policy,
    new_lora,
    sampled_prompts,
    trainer_arguments,
)
from propel_core.training.zero_variance import zero_variance_trainer

log = logging.getLogger("propel")


def train_generator(services: Services, plan: GeneratorPlan, audit: Audit | None = None) -> None:
    """GRPO + LoRA on the plan's generator with the reward rule and probes of ``plan.reward`` ->
    ``plan.folder`` (``adapter/``, ``log.jsonl``, ``reward_log.jsonl``, a checkpoint every
    ``plan.checkpoint_every`` steps). ``plan.seed`` seeds the trainer and ``plan.contexts`` the
    context sampler; a rule that needs ``solver_utility`` labels tasks live as ``plan.solve`` says.
    With ``plan.resume``, training goes on from the folder's last checkpoint (the policy's adapter,
    optimizer, schedule and random state; the reward log keeps the steps before it), else starts
    over. With ``audit`` (``audit_of(services, plan.folder, plan.audit)``, on the main process), the
    policy's own tasks are labeled by the real solver as it trains, which may stop the training early."""
    from trl import GRPOTrainer

    folder, generator, train_config, seed = plan.folder, plan.generator, plan.train, plan.seed
    domain = services.domain()
    _check(domain, train_config, audited=plan.audit is not None)
    replay = train_config.replay
    buffer = ReplayBuffer.of(replay, seed)
    trainer_class = replaying(GRPOTrainer, buffer, replay.slots) if buffer else GRPOTrainer  # checks TRL's shape
    sampler = plan.contexts.sampler(services)
    stop = generation_stop(domain, generator.sampling)
    if stop and train_config.mask_truncated_completions:
        raise PropelError(
            f"train.mask_truncated_completions takes a completion that ended on a stop string ({stop[0]!r}, the "
            "domain's or generator.sampling.stop) for a cut-off one (TRL looks for an end token) and masks it; "
            "set it false: a completion the limit cut is an invalid task, paid reward.overflow_reward"
        )
    reward, solve = plan.reward, solver_labels(services, plan.solve)
    scorer = reward_scorer(
        services, reward, train_config, main_probe(services, reward), solve, stop=stop, sampler=sampler, replay=buffer
    )
    checkpoint = prepare_folder(folder, plan.resume)
    scorer.log_path = folder / "reward_log.jsonl"
    for log_path in (scorer.log_path, folder / COMPLETIONS):
        keep_steps_before(log_path, step_of(checkpoint))
    scorer.stall.resume(logged_steps(scorer.log_path))
    if audit is not None:
        audit.start(step_of(checkpoint))
        scorer.audit = audit

    tokenizer, policy, path = load_policy(generator)
    contexts_by_prompt: dict[str, Context] = {}
    dataset = sampled_prompts(
        sampler, domain.generator_prompt, tokenizer, generator.chat_template, path, contexts_by_prompt
    )
    trainer_class = zero_variance_trainer(
        trainer_class, scorer, train_config.zero_variance, max_refills=train_config.max_refills, section="train"
    )
    if not domain.multi_turn:  # a trajectory ends in the tool results' framing, not the policy's end token
        scorer.stall.ends = end_tokens(tokenizer, policy.generation_config)
    arguments = _grpo_arguments(services, folder, train_config, seed, plan.checkpoint_every, stop)
    if stop and not train_config.use_vllm:
        stopping_at_strings(policy, tokenizer)
    multi_turn = {"rollout_func": EpisodeRollouts(domain, tokenizer, contexts_by_prompt, train_config, seed)}
    pace = Pace(services)  # torch's threads at each step, and its phases on the progress bar
    reward_funcs = [pace.scoring(scorer)]
    if train_config.overlong_buffer:
        from trl.rewards import get_soft_overlong_punishment

        reward_funcs.append(
            get_soft_overlong_punishment(train_config.max_completion_length, train_config.overlong_buffer)
        )
    with colocated_engine(train_config.use_vllm, train_config.vllm_enforce_eager):
        trainer = trainer_class(
            model=policy,
            reward_funcs=reward_funcs,
            args=arguments,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=new_lora(generator, plan.lora),
            **(multi_turn if domain.multi_turn else {}),
        )
    if train_config.use_vllm:
        vllm_weight_sync(trainer)
    generation_batch = train_config.per_device_batch * train_config.gradient_accumulation * process_count()
    prompts = generation_batch // train_config.group_size
    log.info("GRPO: %d steps, %d prompts x %d generations each", train_config.steps, prompts, train_config.group_size)
    base = model_source(generator.model, generator.revision)
    with pace.attached(trainer):
        if not _audited_training(services, trainer, folder, base, checkpoint, audit):
            return
    if not is_main():  # the main process wrote the reward log and says how training went
        return
    rewards = logged_steps(folder / "reward_log.jsonl")
    still = reward_never_moved(rewards)
    services.say(
        f"trained {trainer.state.global_step} steps; reward mean first {rewards[0]['reward_mean']:.3f}, "
        f"last {rewards[-1]['reward_mean']:.3f}; adapter in {folder / 'adapter'}" + (f"; {still}" if still else "")
    )


def _audited_training(
    services: Services, trainer, folder: Path, base: str, checkpoint: Path | None, audit: Audit | None
) -> bool:
    """``train_and_save``, with the audit's callback when there is one: its last audits are waited for
    (dropped if training failed), and a stop rule they met is said in one line. False when the audits
    before the checkpoint had already stopped this training (nothing trains)."""
    stopped = any(gathered(audit is not None and bool(audit.stop_reason)))  # the main process's audit
    if audit is not None:
        trainer.add_callback(audited(audit))
    trainer.add_callback(stopping_together())  # after the audit's: it shares the audit's decision
    if audit is None:  # or another process of a launch, where the main one audits and says
        train_and_save(trainer, folder, base, checkpoint, finished=stopped)
        return not stopped
    if stopped:  # met by the audits before the checkpoint: this training is over
        audit.close()
        services.say(f"training stopped before this run: {audit.stop_reason}; checkpoint.resume=false starts over")
        if not (folder / "adapter").exists():
            train_and_save(trainer, folder, base, checkpoint, finished=True)
        return False
    try:
        train_and_save(trainer, folder, base, checkpoint)
    except BaseException:
        audit.close(cancel=True)
        raise
    audit.close()
    if audit.stop_reason:
        when = f"after step {audit.stopped_at}" if audit.stopped_at is not None else "when training had ended"
        services.say(f"training stopped {when}: {audit.stop_reason}")
    return True


def _check(domain, train_config: TrainConfig, audited: bool) -> None:
    """Refuse, before any model loads, a domain with no generator model to train, vLLM's server mode
    without CUDA, vLLM or replay on a multi-turn domain, and under FSDP a multi-turn domain or an
    ``audited`` training (a generation batch that is not whole groups is refused when the config is read)."""
    import torch

    if sharded() and (domain.multi_turn or audited):  # the plan's audit: co-evolution never audits
        raise PropelError(
            "under FSDP every process must run the same forward passes on the sharded policy: a multi-turn "
            "domain's episodes (turns differ by process) and train.audit (its adapter copy, made by the main "
            "process) cannot; use DDP or DeepSpeed (docs/accelerate/), or set train.audit.every: 0"
        )

    if not domain.uses_generator_model:
        raise PropelError(
            f"domain {domain.name!r} writes its tasks with no model (its generator is a program, "
            "e.g. swe's generator: procedural): there is no generator model to train"
        )
    if train_config.use_vllm and train_config.vllm_mode == "server" and not torch.cuda.is_available():
        raise PropelError(
            "train.vllm_mode: server needs CUDA GPUs (TRL sends the weights to its vLLM server over NCCL); on this "
            "machine use train.vllm_mode: colocate"
        )
    if domain.multi_turn and train_config.use_vllm:
        raise PropelError(
            "train.use_vllm works with single-turn domains: a multi-turn domain's episodes sample each turn from "
            "the policy in the training process; set train.use_vllm: false"
        )
    if domain.multi_turn and train_config.replay.strategy != "none":
        raise PropelError("train.replay works with single-turn domains; set train.replay.strategy: none")


def _grpo_arguments(
    services: Services, folder: Path, train_config: TrainConfig, seed: int, checkpoint_every: int, stop: list[str]
):
    """TRL's GRPOConfig for ``train``'s settings, its generation stopping at the ``stop`` strings."""
    from trl import GRPOConfig

    return trainer_arguments(
        GRPOConfig,
        services,
        folder,
        services.dir.name,
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
        save_steps=checkpoint_every,
        use_vllm=train_config.use_vllm,
        vllm_mode=train_config.vllm_mode,
        vllm_server_base_url=train_config.vllm_server_base_url,
        shuffle_dataset=False,  # a shuffle buffer would draw a thousand prompts ahead of the rewards
        generation_kwargs=({"stop": stop} if train_config.use_vllm else {"stop_strings": stop}) if stop else None,
    )


def stopping_at_strings(policy, tokenizer) -> None:
    """Let TRL's transformers generation stop ``policy`` at stop strings: transformers reads them with
    the tokenizer, which TRL does not pass, so it is bound to the policy's ``generate``; and the rows
    that stopped are padded, so the pad token is one of the ends TRL masks the completion after."""
    policy.generate = functools.partial(policy.generate, tokenizer=tokenizer)
    eos = policy.generation_config.eos_token_id
    ends = eos if isinstance(eos, list) else [] if eos is None else [eos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad not in ends:
        policy.generation_config.eos_token_id = [*ends, pad]


@contextlib.contextmanager
def colocated_engine(use_vllm: bool, enforce_eager: bool | None = None):
    """While TRL builds its colocated vLLM engine, in this process.

    TRL sets the distributed variables (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ...) for vLLM, and
    vLLM its own; afterwards the environment is as it was, so a process this one starts (a solver
    server, an audit's, the next stage's) is not taken for a rank of a distributed run. Without CUDA,
    vLLM's CPU build sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB), not from TRL's GPU
    memory share, so it is the vllm backend's CPU default (``CPU_KV_CACHE_GB``) unless set; the engine
    runs eager where ``enforce_eager`` says, by default on a CPU build, as the vllm backend's does there
    (TRL has no setting for it: its ``LLM`` is given the argument while the trainer is built); and its
    worker binds the process to the cores it picks, sets torch's threads and replaces
    ``torch.set_num_threads`` with a no-op: afterwards the process's cores, torch's threads and
    ``torch.set_num_threads`` are as they were, so training, the
    executor's thread choice and whatever runs next keep the machine they had."""
    import os

    import torch

    if not use_vllm:
        yield
        return
    environment = dict(os.environ)
    cpu = not torch.cuda.is_available()
    cores, threads, set_threads = os.sched_getaffinity(0), torch.get_num_threads(), torch.set_num_threads
    if cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        from propel_plugins.vllm_backend import CPU_KV_CACHE_GB

        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(CPU_KV_CACHE_GB))  # the variable takes whole GiB
    from trl.generation import vllm_generation

    engine = getattr(vllm_generation, "LLM", None)  # none without vLLM: TRL then says to install it
    try:
        if engine is not None and (enforce_eager or (enforce_eager is None and cpu)):
            vllm_generation.LLM = functools.partial(engine, enforce_eager=True)
        yield
    finally:
        if engine is not None:
            vllm_generation.LLM = engine
        os.environ.clear()
        os.environ.update(environment)
        if cpu:
            torch.set_num_threads = set_threads
            os.sched_setaffinity(0, cores)
            torch.set_num_threads(threads)


def vllm_weight_sync(trainer) -> None:
    """Make TRL's colocated vLLM engine take the policy's weights each step on vLLM's CPU build.

    TRL copies each weight into the engine with the model's ``load_weights``. The CPU build packs every
    linear layer's weight for its kernels when it loads the model and drops the original parameter, so
    that call fails (``AttributeError: 'Parameter' object has no attribute 'weight_loader'``). vLLM's
    own in-place reload (``reload_weights``) unpacks, loads and packs again; the sync goes through it,
    with the adapter merged into copies of the weights (TRL unmerges it once they are read). A GPU
    build, and server mode, keep TRL's own sync."""
    from vllm.platforms import current_platform

    generation = trainer.vllm_generation
    if generation.mode != "colocate" or not current_platform.is_cpu():
        return
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner

    def sync_weights() -> None:
        weights = [(name, weight.clone()) for name, weight in generation._iter_named_params()]
        runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights


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
