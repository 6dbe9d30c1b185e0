"""train: GRPO with LoRA on the generator, rewarded by the probe, no solver -> ``RUN/train/``.

The policy is the generator model with LoRA adapters on the configured projections; the probe reads a
separate, frozen copy of the reference model, so the reward depends on the task text alone (paper
3.3). Writes the adapter (``train/adapter/``), checkpoints every ``checkpoint.every`` steps,
TRL's metrics (``train/log.jsonl``) and the scorer's per-step diagnostics (``train/reward_log.jsonl``).
A rerun resumes from the last checkpoint when ``checkpoint.resume`` (the default) and refuses when the
settings the folder's training was made with differ (``RUN/settings.json``), from its first logged
step, checkpoint or not: the train section, the reward rule and its options, the probe bundles it reads
(by content) and, for a rule reading live solver utility, the solver's settings. A folder that holds a
training but no checkpoint has nothing to resume from and is refused too; ``checkpoint.resume: false``
starts over, moving the old folder aside (``RUN/train.old-TIME/``). Each reward call logs the rule's
name and options and keeps a sample of its completions with their rewards (``train/completions.jsonl``).
Multi-GPU: ``accelerate launch -m propel_core.cli train CONFIG`` with the same config.
"""

from __future__ import annotations

from functools import partial

from propel_core.ranks import is_main
from propel_core.run import Run
from propel_core.training.audit import audit_of
from propel_core.training.checkpoints import goes_on, prepare_folder
from propel_core.training.generator import train_generator
from propel_core.training.generator_reward import reward_reads


def train(run: Run) -> None:
    """GRPO + LoRA on the generator with the probe reward -> train/ (adapter, logs); a rerun goes on
    from the last checkpoint (``checkpoint.resume: false`` starts over, the old folder moved aside)."""
    plan = run.plans.train
    # what the folder holds counts from its first logged step (resuming): logs, checkpoints, an adapter
    exists = goes_on(plan.folder, plan.resume)
    run.claim("train", exists, *reward_reads(run.services, plan.reward))  # rule, options, bundles
    # before a model loads: records with no checkpoint refused, or (starting over) moved aside, said here
    prepare_folder(plan.folder, plan.resume, run.say)
    audit = None
    # K real attempts at a sample of the step's tasks, labeled as label does; under `accelerate launch`
    # the main process audits each whole step (the reward gathers every process's generations)
    if plan.audit is not None and is_main():
        track = partial(run.track, "train")  # each audit's metrics, at the step it audited
        audit = audit_of(run.services, plan.folder, plan.audit, track)
    train_generator(run.services, plan, audit)
