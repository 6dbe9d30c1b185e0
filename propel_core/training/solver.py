"""The solver's training, with LoRA on the solver model: RL on a task set (``solve-train``: TRL's GRPO or
RLOO, rewarded by :class:`~propel_core.training.solver_reward.SolverRewards`), and supervised
fine-tuning on its own verified, clean attempts (``self-train``, the progress-aware sampling study,
section 3.4)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from propel_core.backend import prefill, prompt_text
from propel_core.domain import Domain
from propel_core.embedded import model_source
from propel_core.errors import PropelError
from propel_core.execution import graded_texts
from propel_core.ranks import is_main, process_count
from propel_core.records import Context, SolverAttempt, Task
from propel_core.training.checkpoints import keep_steps_before, step_of, train_and_save
from propel_core.training.feedback import logged_steps, reward_never_moved
from propel_core.training.pace import Pace
from propel_core.training.replay import ReplayBuffer, replaying
from propel_core.training.solver_reward import SolverRewards
from propel_core.training.trainer import load_policy, new_lora, sampled_prompts, trainer_arguments
from propel_core.training.zero_variance import zero_variance_trainer

if TYPE_CHECKING:
    from propel_core.plans import SelfTrainPlan, SolverPlan
    from propel_core.probes.bundles import ProbeScorer
    from propel_core.services import Services


def train_solver(
    services: Services, plan: SolverPlan, tasks: list[Task], reward_model: ProbeScorer | None, checkpoint: Path | None
) -> None:
    """RL-train the plan's solver on ``tasks`` as ``plan.options`` (solve-train's settings) say, from
    ``checkpoint`` when resuming; the adapter, the reward log and the rollouts land in ``plan.folder``.
    The rule ``options.reward_rule`` (None: 1 when solved) scores a verdict with ``plan.reward``'s
    settings; ``reward_model`` scores rollouts in RM-GRPO's model steps; ``plan.lora`` is the adapter
    trained, and a checkpoint is saved every ``plan.checkpoint_every`` steps."""
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    folder, options, solver, seed = plan.folder, plan.options, plan.solver, plan.seed
    generation_batch = options.per_device_batch * process_count()  # TRL's, with no gradient accumulation
    if generation_batch % options.group_size:
        raise PropelError(
            f"solve_train.per_device_batch ({options.per_device_batch}) x {process_count()} process(es) must be a "
            f"multiple of solve_train.group_size ({options.group_size}): a step's completions are whole groups"
        )
    rule = services.registry.reward_rule(options.reward_rule, plan.reward) if options.reward_rule else None
    domain = services.domain()
    # the training tasks are the sampler's contexts (bucket: the task's topic), so ``progress`` can
    # steer solver training by the verifier's rewards, as it steers generator training by the probe's
    contexts = {str(i): Context(id=str(i), data={}, bucket=task.topic or "all") for i, task in enumerate(tasks)}
    sampler = services.registry.context_sampler(
        options.context_sampler, list(contexts.values()), seed, **options.sampler_options
    )
    for name in ("reward_log.jsonl", "rollouts.jsonl"):  # resuming: what the steps redone wrote goes
        keep_steps_before(folder / name, step_of(checkpoint))
    buffer = ReplayBuffer.of(options.replay, seed)
    reward = SolverRewards(
        domain,
        tasks,
        lambda attempts: graded_texts(services, attempts, solver),
        folder,
        rule=rule,
        reward_model=reward_model,
        verifier_steps=options.verifier_steps,
        model_steps=options.model_steps,
        sampler=sampler,
        contexts=contexts,
        replay=buffer,
        track=lambda metrics, step: services.track(f"solve/{options.name}", metrics, step),
        group_size=options.group_size,
        max_completion_length=options.max_completion_length,
    )
    batch = options.per_device_batch
    tokenizer, model, path = load_policy(solver)
    solver_messages = lambda context: domain.solver_prompt(tasks[int(context.id)].payload)  # noqa: E731
    dataset = sampled_prompts(sampler, solver_messages, tokenizer, solver.chat_template, path)
    config_class, trainer_class = (
        (RLOOConfig, RLOOTrainer) if options.algorithm == "rloo" else (GRPOConfig, GRPOTrainer)
    )
    arguments = trainer_arguments(
        config_class,
        services,
        folder,
        f"{services.dir.name}-solve-{options.name}",
        steps=options.steps,
        lr=options.lr,
        batch=batch,
        seed=seed,
        beta=options.beta,
        num_generations=options.group_size,
        gradient_accumulation_steps=1,
        temperature=options.temperature,
        max_completion_length=options.max_completion_length,
        save_steps=plan.checkpoint_every,
        shuffle_dataset=False,
    )
    if buffer is not None:
        trainer_class = replaying(trainer_class, buffer, options.replay.slots)
    trainer_class = zero_variance_trainer(
        trainer_class, reward, options.zero_variance, max_refills=options.max_refills, section="solve_train"
    )
    pace = Pace(services, f"solve-train {options.name}")
    trainer = trainer_class(
        model=model,
        reward_funcs=pace.scoring(reward),
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=new_lora(solver, plan.lora),
    )
    with pace.attached(trainer):
        train_and_save(trainer, folder, model_source(solver.model, solver.revision), checkpoint)
    if is_main() and (still := reward_never_moved(logged_steps(reward.log_path))) is not None:
        services.say(f"solve_train {options.name}: {still}")


def fine_tune_solver(
    services: Services, plan: SelfTrainPlan, kept: list[tuple[Task, str]], funnel: dict[str, int]
) -> None:
    """Fine-tune the plan's solver (SFT, completion-only loss) on ``kept`` attempts at their tasks,
    mixed with original rows as ``plan.options`` say; ``filter_report.json`` in ``plan.folder`` records
    ``funnel``."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    folder, options, solver, seed = plan.folder, plan.options, plan.solver, plan.seed
    domain = services.domain()
    tokenizer, model, _ = load_policy(solver)
    rows = []
    for task, text in kept:
        messages = domain.solver_prompt(task.payload)
        start = prefill(messages)  # the prompt already ends with it; the completion is the rest
        rows.append(
            {
                "prompt": prompt_text(tokenizer, messages, solver.chat_template, "solver"),
                "completion": text[len(start) :] + (tokenizer.eos_token or ""),
            }
        )
    mixed = mix(rows, options, seed=seed)
    report = {"funnel": funnel, "self_rows": len(rows), "original_rows": len(mixed) - len(rows), "rows": len(mixed)}
    (folder / "filter_report.json").write_text(json.dumps(report, indent=2))
    for step, count in funnel.items():
        services.say(f"  {count:6d}  {step}")
    services.say(f"fine-tuning on {len(mixed)} rows ({len(rows)} self-generated, {len(mixed) - len(rows)} original)")
    random.Random(seed).shuffle(mixed)
    arguments = trainer_arguments(
        SFTConfig,
        services,
        folder,
        f"{services.dir.name}-self-train",
        steps=options.steps,
        lr=options.lr,
        batch=options.batch_size,
        seed=seed,
        save_strategy="no",
        completion_only_loss=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=arguments,
        train_dataset=Dataset.from_list(mixed),
        processing_class=tokenizer,
        peft_config=new_lora(solver, plan.lora),
    )
    with Pace(services, "self-train", first="updating").attached(trainer):  # SFT: no sampling, no reward
        train_and_save(trainer, folder, model_source(solver.model, solver.revision))


def keep_clean(domain: Domain, attempts: list[SolverAttempt], max_chars: int, funnel: dict[str, int]) -> list[str]:
    """The graded attempts that pass each filter in turn (verified, within ``max_chars``, then the
    domain's ``clean_checks``), counting in ``funnel`` what every filter keeps."""
    survivors = []
    for attempt in attempts:
        funnel["sampled"] += 1
        if not attempt.solved:
            continue
        funnel["verified correct"] += 1
        if len(attempt.text) > max_chars:
            continue
        funnel["within self_train.max_chars"] += 1
        for name, passed in domain.clean_checks(attempt):
            funnel.setdefault(name, 0)
            if not passed:
                break
            funnel[name] += 1
        else:
            survivors.append(attempt.text)
    return survivors


def mix(rows: list[dict], options, seed: int) -> list[dict]:
    """The self-generated rows plus original rows (``self_train.mix_path``, prompt/completion JSONL)
    making up ``self_train.mix_share`` of the result (the progress-aware sampling study: 30% naive, 50% clean)."""
    import random

    if not options.mix_path:
        return list(rows)
    original = [json.loads(line) for line in Path(options.mix_path).read_text().splitlines() if line.strip()]
    wanted = round(len(rows) * options.mix_share / (1 - options.mix_share))
    chosen = random.Random(seed).sample(original, min(wanted, len(original)))
    return list(rows) + [{"prompt": row["prompt"], "completion": row["completion"]} for row in chosen]
