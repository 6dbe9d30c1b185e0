"""The schema of a run's configuration: typed sections, validated (reading YAML files and ``key=value``
overrides into it, and the plans it gives the library, are :mod:`propel_core.plans`'s).

Defaults are the paper's (appendices 14 and 16) where it gives one. Every problem is reported before
any model loads, naming the key, the bad value and what is allowed; names of plugin components
(``reward.rule``, ``domain.name``, ...) are checked against what is installed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.provenance import flat
from propel_core.records import readable


class ConfigError(PropelError):
    """The configuration is invalid; the message lists every problem found."""


def component(kind: str, default: Any = ..., **kwargs: Any) -> Any:
    """A field holding the registered name(s) of a ``kind`` component, checked against the registry."""
    return Field(default, json_schema_extra={"component": kind}, **kwargs)


def options_of(field: str, **kwargs: Any) -> Any:
    """A field holding the options of the component the sibling ``field`` names, checked against that
    component's factory (``Registry.check_options``) when the config is read."""
    return Field(default_factory=dict, json_schema_extra={"options_of": field}, **kwargs)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _merge_with_field_defaults(cls, data: Any) -> Any:
        """A nested section given in part keeps the rest of its field's default, not of its class:
        ``solver: {sampling: {max_new_tokens: 64}}`` keeps the solver's temperature 0.6."""
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        for name, info in cls.model_fields.items():
            if isinstance(data.get(name), dict) and not info.is_required():
                default = info.get_default(call_default_factory=True)
                if isinstance(default, BaseModel):
                    merged[name] = _merge(default.model_dump(exclude_unset=True), data[name])
        return merged


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, nested dicts merged key by key."""
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merge(merged[key], value) if both else value
    return merged


class Sampling(Section):
    """Sampling knobs of one model role."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 turns top-k filtering off")
    max_new_tokens: int = Field(512, gt=0)
    stop: list[typing.Annotated[str, Field(min_length=1)]] = Field(
        [],
        description="strings that end a completion where it first writes one (left out of it); a domain's "
        "own stop strings are added for its generator's single-turn generations",
    )

    def stopping_at(self, stop: typing.Sequence[str]) -> Sampling:
        """These knobs with ``stop`` added to the stop strings (each once, the added ones first)."""
        return self.model_copy(update={"stop": list(dict.fromkeys([*stop, *self.stop]))})


class ModelConfig(Section):
    """One model role. ``model: null`` is the embedded default (SmolLM2-135M-Instruct)."""

    model: str | None = Field(None, description="Hugging Face id or local path; null = embedded default")
    backend: str = component("model_backends", "transformers")
    revision: str | None = None
    adapter: str | None = Field(None, description="a LoRA adapter folder applied on top of the model")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = Field("auto", description="auto, cpu, cuda, cuda:1, mps")
    chat_template: bool = Field(True, description="wrap prompts in the model's chat template")
    batch_size: int = Field(8, gt=0, description="prompts per generation call")
    sampling: Sampling = Sampling()
    # OpenAI-compatible endpoints (backend: openai)
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = Field(8, gt=0)
    max_retries: int = Field(3, ge=0)
    options: dict[str, Any] = options_of("backend", description="the backend's own options (openai: timeout)")

    @property
    def model_id(self) -> str:
        """The name a task records as its generator: the model (or the embedded default's name), and
        the adapter when one is applied."""
        from propel_core.embedded import EMBEDDED_MODEL_ID

        return (self.model or EMBEDDED_MODEL_ID) + (f"+{self.adapter}" if self.adapter else "")

    @field_validator("model")
    @classmethod
    def _local_model_is_there(cls, model: str | None) -> str | None:
        """A model named by a path (``/``, ``./``, ``../``, ``~`` or more than one ``/``) must exist when
        the config is read: otherwise the first stage fails after its start, with files written."""
        path = model is not None and (model.startswith(("/", "./", "../", "~")) or model.count("/") > 1)
        if path and not Path(model).expanduser().exists():
            raise ValueError(
                f"model {os.path.normpath(model)} does not exist; give a local model folder, a .gguf file or a "
                "Hugging Face hub id (owner/name)"
            )
        return model

    @property
    def simulated(self) -> bool:
        """Whether no model answers in this role: its backend is not one of the model-loading ones (a
        simulated solver, such as propel-arithmetic's ``arithmetic_skill``)."""
        return self.backend not in ("transformers", "vllm", "openai")

    @property
    def shown(self) -> str:
        """What a person is told runs this role: the model, or the backend where it is not one of the
        model-loading backends (a simulated solver names no model of its own)."""
        if not self.simulated:
            return self.model_id
        return f"{self.backend} backend" + (f" ({self.model})" if self.model else "")

    def with_adapter(self, adapter: str | Path | None) -> ModelConfig:
        """This model with the LoRA adapter at ``adapter`` applied (None: the base model)."""
        return self.model_copy(update={"adapter": str(adapter) if adapter else None})

    server_extensions: bool = Field(
        True, description="send vLLM/SGLang request fields (top_k, continue_final_message); false for other servers"
    )


def _role(**sampling: Any) -> Any:
    return Field(default_factory=lambda: ModelConfig(sampling=Sampling(**sampling)))


class DomainConfig(Section):
    name: str = component("domains")
    options: dict[str, Any] = options_of("name", description="passed to the domain's factory")


class ExecutorConfig(Section):
    """Where solver attempts and generator episodes run (label, evaluate, generate, the SIL reward,
    solve-train's evaluation, self-train): ``local`` threads here, ``ray`` tasks on a cluster."""

    name: str = component("executors", "local")
    workers: int = Field(8, gt=0, description="jobs (attempts or episodes) in flight at once")
    options: dict[str, Any] = options_of(
        "name", description="the executor's own options (ray: address, resources, num_cpus, max_retries)"
    )


class GenerateConfig(Section):
    num_tasks: int = Field(64, gt=0, description="generations to sample")
    context_sampler: str = component("context_samplers", "uniform")
    sampler_options: dict[str, Any] = options_of("context_sampler")


class LabelConfig(Section):
    k: int = Field(8, gt=0, description="solver attempts per task")
    band_low: float = Field(1 / 8, ge=0.0, le=1.0, description="a: lowest in-band solve rate")
    band_high: float = Field(3 / 8, ge=0.0, le=1.0, description="b: highest in-band solve rate")
    min_valid_attempts: int = Field(1, gt=0, description="fewer gradable attempts leave utility unknown")

    @model_validator(mode="after")
    def _band_in_order(self) -> LabelConfig:
        if self.band_low > self.band_high:
            raise ValueError(f"band_low ({self.band_low}) must not exceed band_high ({self.band_high})")
        if self.min_valid_attempts > self.k:
            raise ValueError(f"min_valid_attempts ({self.min_valid_attempts}) exceeds k ({self.k})")
        if not self.reachable_in_band():
            logging.getLogger("propel").warning(
                "label: no solve rate that k=%d attempts can give lies in the band [%.4g, %.4g], so every task "
                "will be out of band and the probe will have no positives; widen label.band_low/band_high or "
                "raise label.k",
                self.k,
                self.band_low,
                self.band_high,
            )
        return self

    def reachable_in_band(self) -> bool:
        """Whether some solve rate j/n (n gradable attempts, ``min_valid_attempts`` <= n <= k) is in band."""
        rates = (j / n for n in range(self.min_valid_attempts, self.k + 1) for j in range(n + 1))
        return any(self.band_low - 1e-9 <= rate <= self.band_high + 1e-9 for rate in rates)


class ProbeConfig(Section):
    layers: list[int] = Field(default_factory=lambda: [3, 7, 11, 15, 19, 23, 27, 31])
    poolings: list[str] = component("poolers", default_factory=lambda: ["last_token", "mean_full", "mean_last_50"])
    turn_vector: str = component("poolers", "mean_full", description="one vector per turn of a multi-turn task")
    architectures: list[str] = component("probe_architectures", default_factory=lambda: ["linear", "mlp"])
    balance: list[Literal["downsample", "weighted"]] = Field(default_factory=lambda: ["downsample"])
    split: Literal["random", "grouped_kfold"] = "random"
    folds: int = Field(5, gt=1)
    max_length: int = Field(2048, gt=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    batch_size: int = Field(64, gt=0)
    epochs: int = Field(50, gt=0)
    patience: int = Field(7, gt=0)
    seeds: list[int] = Field(default_factory=lambda: [0])
    rvp_samples: int = Field(512, gt=0)
    max_ece: float = Field(0.15, ge=0, le=1, description="selection keeps cells at most this miscalibrated")
    rvp_tolerance: float = Field(
        0.02, ge=0, description="cells this close to the best balanced accuracy compete on RVP"
    )
    calibrate: bool = False

    @model_validator(mode="after")
    def _each_once(self) -> ProbeConfig:
        for name in ("layers", "poolings", "architectures", "balance", "seeds"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name} lists nothing; the sweep needs at least one")
            repeated = sorted({str(v) for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"{name} lists {', '.join(repeated)} more than once; name each once")
        return self


#: how far below the lowest logit the probe gives a valid labeled task a rule paid in logits pays an
#: invalid or a cut-off generation, when ``reward.r_bad`` / ``reward.overflow_reward`` are null
R_BAD_MARGIN = 1.0
#: the paper's reward of an invalid task and of an overlong one, for rules not paid in logits
PAPER_R_BAD, PAPER_OVERFLOW_REWARD = -0.2, 0.0


class RewardConfig(Section):
    rule: str = component("reward_rules", "hard")
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        json_schema_extra={"options_by_name": "reward_rules"},
        description="each reward rule's own options, by its name: {my_rule: {threshold: 0.3}}; a rule gets its "
        "entry wherever it is used (train, coevolve, solve_train, the probe stage's RVP)",
    )
    r_bad: float | None = Field(
        None,
        allow_inf_nan=False,
        description="reward of an invalid task; null: R_BAD_MARGIN below the lowest logit the probe gives a valid "
        "labeled task, for a rule paid in logits (hard, wco, adversarial), else the paper's -0.2",
    )
    overflow_reward: float | None = Field(
        None,
        allow_inf_nan=False,
        description="reward of a completion cut off at the length limit; null: the calibrated r_bad, for a rule paid "
        "in logits, else the paper's 0.0",
    )
    main_probe: str | None = Field(None, description="the scorer the rules read; null = RUN/probes/selected")
    probes: list[str] = Field(default_factory=list, description="extra probe bundles (ensemble, auxiliary)")

    def settled(self, paid_in_logits: bool, lowest_logit: float | None, probes: str = "the probe") -> RewardConfig:
        """These settings with ``r_bad`` and ``overflow_reward`` set where they are null. A rule paid in
        logits (its valid tasks earn a probe logit) pays both ``R_BAD_MARGIN`` below ``lowest_logit``, the
        lowest logit the probe bundles it reads (``probes``, for the message) give any valid labeled task,
        so no invalid or cut-off generation earns more than any valid task of that corpus (the policy's
        own valid tasks may score lower still); any other rule keeps its
        own scale, with the paper's -0.2 and 0.0. An explicit value always wins."""
        if self.r_bad is not None and self.overflow_reward is not None:
            return self
        if not paid_in_logits:
            r_bad, overflow = PAPER_R_BAD, PAPER_OVERFLOW_REWARD
        elif lowest_logit is None or not math.isfinite(lowest_logit):
            found = (
                "records no lowest valid logit"
                if lowest_logit is None
                else f"gives a valid task the logit {lowest_logit}"
            )
            raise PropelError(
                f"{probes} {found} (a bundle made before propel recorded it, by hand, or a head that diverged), so "
                "r_bad cannot be calibrated: run `propel probe` again, or set reward.r_bad and reward.overflow_reward"
            )
        else:
            r_bad = overflow = round(lowest_logit - R_BAD_MARGIN, 4)
        r_bad = self.r_bad if self.r_bad is not None else r_bad
        overflow = self.overflow_reward if self.overflow_reward is not None else overflow
        return self.model_copy(update={"r_bad": r_bad, "overflow_reward": overflow})


class ReplayConfig(Section):
    strategy: Literal["none", "round_robin", "top_k", "stable_uniform", "previous_step"] = "none"
    slots: int = Field(1, gt=0, description="fresh completions per group swapped for replayed ones")
    min_reward: float = Field(0.5, description="the admission threshold")
    comparison: Literal[">", ">="] = Field(">", description="strict > keeps exact-threshold generations out")
    capacity: int = Field(8, gt=0, description="generations kept per prompt (the best)")


class AuditConfig(Section):
    """Real solver labels of the policy's own tasks while it trains (``propel_core/training/audit.py``)."""

    every: int = Field(0, ge=0, description="audit every N steps (0: no audit)")
    tasks: int = Field(16, gt=0, description="tasks of the step's generations labeled per audit")
    k: int | None = Field(
        None, gt=0, description="solver attempts per audited task; null: label.k, the K the probe learned the band at"
    )
    stop_gap: float | None = Field(
        None, gt=0, le=1, description="stop when |probe probability - real in-band rate| exceeds this"
    )
    stop_after: int = Field(2, gt=0, description="... in this many audits in a row")
    stop_drop: float | None = Field(
        None, gt=0, le=1, description="stop when audited utility falls this far below its best"
    )


#: what a GRPO training does with a group whose completions all earned one reward (docs/config.md)
ZeroVariance = Literal["keep", "drop", "refill"]
ZERO_VARIANCE = (
    "a group whose completions all earned one reward: keep (TRL's way: no policy gradient, but its tokens "
    "count in the loss's normalizer), drop (out of the loss and the normalizer, as DAPO filters it) or refill "
    "(DAPO's dynamic sampling: dropped, and replaced by groups of further prompts, max_refills draws at most)"
)
MAX_REFILLS = "zero_variance: refill: further draws of prompts a step makes at most to replace its groups of one reward"
#: the loss types whose normalizer counts the tokens of the completions kept across the generation
#: batch, so that a dropped group is out of the step exactly (under grpo's and dr_grpo's means over
#: completions it would still count, and bnpo divides each micro-batch by its own tokens)
TOKEN_LEVEL_LOSSES = ("dapo", "cispo")


class TrainConfig(Section):
    steps: int = Field(50, gt=0)
    lr: float = Field(5e-5, gt=0)
    beta: float = Field(0.1, ge=0, description="KL coefficient (paper: 0.1 math, 0.05 AZR)")
    group_size: int = Field(4, gt=1)
    per_device_batch: int = Field(8, gt=0)
    gradient_accumulation: int = Field(8, gt=0)
    temperature: float = Field(0.9, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(20, ge=0)
    max_completion_length: int = Field(512, gt=0)
    max_turn_tokens: int = Field(2048, gt=0, description="multi-turn domains: tokens per generated turn")
    overlong_buffer: int = Field(
        0, ge=0, description="DAPO soft overlong penalty over the last N tokens before max_completion_length; 0: off"
    )
    mask_truncated_completions: bool = Field(False, description="TRL: leave truncated completions out of the loss")
    gradient_checkpointing: bool = Field(True, description="TRL's default; off is faster where memory allows")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"] = "grpo"
    epsilon_low: float = Field(0.2, gt=0)
    epsilon_high: float | None = None
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="TRL's vLLM generation: in the training process, or a `trl vllm-serve` server"
    )
    vllm_server_base_url: str | None = None
    vllm_enforce_eager: bool | None = Field(
        None,
        description="colocate mode: TRL's vLLM engine runs eager (no compilation, no CUDA graphs); null: eager on "
        "a CPU build (compiling took about 90 s at start and paid back after about 7 steps on 2 cores), vLLM's "
        "default on a GPU",
    )
    replay: ReplayConfig = ReplayConfig()
    audit: AuditConfig = AuditConfig()
    zero_variance: ZeroVariance = Field("keep", description=ZERO_VARIANCE)
    max_refills: int = Field(3, gt=0, description=MAX_REFILLS)

    @model_validator(mode="after")
    def _drop_needs_a_token_level_loss(self):
        mode = self.zero_variance
        if mode != "keep" and self.loss_type not in TOKEN_LEVEL_LOSSES:
            raise ValueError(
                f"zero_variance: {mode} needs a loss normalized by the batch's tokens (loss_type: "
                f"{' or '.join(TOKEN_LEVEL_LOSSES)}): under {self.loss_type} a dropped group would still count"
            )
        if mode != "keep" and self.overlong_buffer:
            raise ValueError(
                f"zero_variance: {mode} judges a group by the rule's rewards, and overlong_buffer adds a length "
                "penalty that gives such a group a spread to learn from: set one of them off"
            )
        return self


class LoraConfig(Section):
    """The LoRA adapter every training puts on its model: the generator's (train, coevolve), the
    solver's (solve-train, self-train) and the reference's under a ranker (``rank.lora``, which sizes
    its own with ``rank.lora_r`` and ``lora_alpha``)."""

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class CheckpointConfig(Section):
    """Checkpoints of the trainings that save them (train, coevolve, solve-train)."""

    every: int = Field(10, gt=0, description="optimizer steps between checkpoints")
    resume: bool = Field(
        True, description="go on from the last checkpoint in the folder; false: start over, the old folder moved aside"
    )


class EvaluateConfig(Section):
    num_tasks: int = Field(1024, gt=0)
    k: int = Field(8, gt=0)
    adapter: Literal["final", "best_audited"] = Field(
        "final", description="the trained arm: train/adapter, or the one with the best audited utility (train.audit)"
    )


class CoevolveConfig(Section):
    mode: Literal["adversarial", "wco"] = Field(
        "adversarial", description="adversarial: auxiliary probe on mined false positives; wco: probe ensemble"
    )
    false_positive_probability: float = Field(
        0.5, gt=0, lt=1, description="a valid out-of-band task the probe scores at least this high is a false positive"
    )
    dominant_topic: bool = Field(True, description="also count the trained policy's most common topic as negatives")
    ensemble_size: int = Field(2, ge=2, description="wco: probes in the ensemble, the selected one included")


class RankConfig(Section):
    items: Literal["tasks", "attempts"] = Field(
        "tasks", description="what is ranked: tasks, or solver attempts by diagnostics.verifier_score within a task"
    )
    labels: str | None = Field(
        None, description="labels.jsonl (tasks.jsonl beside it; relative to run_dir, or absolute); null: the stage's"
    )
    score: Literal["band_distance", "solve_rate"] = Field(
        "band_distance", description="items: tasks: the verifier score that orders pairs"
    )
    layer: int | None = Field(None, ge=0, description="without a selected probe: the reference layer; null = middle")
    pooling: str = component("poolers", "mean_full", description="without a selected probe: the pooler")
    architecture: str = component("probe_architectures", "linear")
    held_out: float = Field(0.2, gt=0, lt=1, description="share of tasks held out for the metrics")
    max_pairs: int = Field(20_000, gt=0)
    epochs: int = Field(20, gt=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    batch_size: int = Field(64, gt=0)
    refresh: bool = Field(False, description="refresh the saved ranker on the trained policy's verified tasks")
    lora: bool = Field(
        False, description="train a LoRA on the reference jointly with the head (the ML-engineering RL study's refresh)"
    )
    lora_r: int = Field(8, gt=0)
    lora_alpha: int = Field(16, gt=0)
    lora_lr: float = Field(1e-5, gt=0)
    lora_steps: int = Field(200, gt=0)
    lora_batch_pairs: int = Field(4, gt=0, description="pairs per LoRA step")


class SolveTrainConfig(Section):
    name: str = Field("trained-tasks", description="the run's folder: RUN/solve/NAME/")
    tasks: str = Field("eval/trained/tasks.jsonl", description="training tasks (relative to run_dir, or absolute)")
    in_band_only: bool = Field(True, description="only tasks whose labels.jsonl beside them says in band")
    held_out: str = Field("tasks.jsonl", description="held-out tasks: its first held_out_tasks valid ones")
    held_out_tasks: int = Field(64, gt=0)
    algorithm: Literal["rloo", "grpo"] = "rloo"
    steps: int = Field(100, gt=0, description="the progress-aware sampling study: 100 steps")
    group_size: int = Field(8, gt=1, description="the progress-aware sampling study: 8")
    per_device_batch: int = Field(8, gt=0)
    lr: float = Field(1e-5, gt=0, description="the progress-aware sampling study: 1e-5")
    beta: float = Field(0.0, ge=0)
    temperature: float = Field(1.0, gt=0)
    max_completion_length: int = Field(512, gt=0)
    eval_k: int = Field(16, gt=0, description="attempts per held-out task (pass@k for k up to this)")
    baseline: str | None = Field(None, description="another solve run's NAME to compare with per prompt")
    context_sampler: str = component("context_samplers", "uniform")
    sampler_options: dict[str, Any] = options_of("context_sampler")
    reward_rule: str | None = component(
        "reward_rules",
        None,
        description="null: 1 when solved, else 0; a reward rule (partial_instrumentation) reads each verdict's "
        "markers and verifier_score, with the reward section's settings",
    )
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="replay of rollouts (grpo only)")
    reward_model: str | None = Field(
        None, description="RM-GRPO: a calibrated ranker bundle (propel rank) that scores model steps"
    )
    zero_variance: ZeroVariance = Field(
        "keep", description=f"{ZERO_VARIANCE}; under rloo the kept completions' mean is the loss"
    )
    max_refills: int = Field(3, gt=0, description=MAX_REFILLS)
    verifier_steps: int = Field(1, gt=0, description="RM-GRPO: verifier-scored steps per cycle")
    model_steps: int = Field(0, ge=0, description="RM-GRPO: reward-model-scored steps per cycle (0: verifier only)")

    @model_validator(mode="after")
    def _reward_model_for_model_steps(self):
        if self.model_steps and not self.reward_model:
            raise ValueError("model_steps > 0 needs reward_model: the ranker bundle that scores those steps")
        if self.model_steps and not self.reward_rule:
            raise ValueError(
                "model_steps > 0 needs a reward_rule (partial_instrumentation): the reward model's calibrated "
                "scores are on the verifier's scale, not 1 or 0"
            )
        return self


class SelfTrainConfig(Section):
    tasks: str = Field("tasks.jsonl", description="the tasks to sample on (valid ones)")
    k: int = Field(32, gt=0, description="solver attempts per task (the progress-aware sampling study: 32)")
    max_chars: int = Field(2000, gt=0, description="the length cap")
    per_task_cap: int = Field(
        2, gt=0, description="attempts kept per task, shortest first (the progress-aware sampling study: 2, clean: 1)"
    )
    mix_path: str | None = Field(None, description="original prompt/completion JSONL to mix in")
    mix_share: float = Field(
        0.3, ge=0, lt=1, description="share of original rows in the mix (the progress-aware sampling study: 0.3)"
    )
    steps: int = Field(100, gt=0)
    lr: float = Field(1e-5, gt=0)
    batch_size: int = Field(8, gt=0)


class RoundsConfig(Section):
    """``propel rounds``: the generator and the solver trained in turns, the probe refreshed from the
    trained solver's labels each round (RUN/rounds/rN/)."""

    num_rounds: int = Field(3, gt=0, description="rounds to run; raising it later adds rounds to a finished run")
    tasks: int = Field(64, gt=0, description="tasks each round's trained generator writes")
    in_band_probability: float = Field(
        0.5, gt=0, lt=1, description="the probe's probability from which a round's task trains the solver"
    )
    min_solver_tasks: int = Field(
        4, gt=0, description="when fewer tasks reach in_band_probability, the solver trains on this many best scored"
    )
    label_budget: int = Field(
        16, gt=0, description="tasks labeled per round (label.k attempts each) by the trained solver: refresh and audit"
    )
    old_weight: float = Field(
        0.5, gt=0, le=1, description="share of labels kept per round of age when the probe is refit (1: all kept)"
    )
    audit_previous: bool = Field(True, description="label the same tasks with the solver before the round's training")
    trace: bool = Field(
        False, description="show the generator the last round's labeled tasks and outcomes (the trace sampler)"
    )
    generator: Literal["every_round", "first_round", "base"] = Field(
        "every_round",
        description="train the generator every round against its probe, in round 1 only (then kept), or never",
    )
    refresh_probe: bool = Field(True, description="refit the probe each round (false: the first one throughout)")
    held_out: str = Field("tasks.jsonl", description="the solver's held-out tasks: the first held_out_tasks valid")
    held_out_tasks: int = Field(32, gt=0)


class PropelConfig(Section):
    """A whole run. ``run_dir`` is the folder every stage reads from and writes to."""

    run_dir: Path = Path("runs/default")
    seed: int = Field(0, ge=0, lt=2**32, description="every seed of the run derives from it (numpy takes 0..2**32-1)")
    report_to: list[Literal["none", "tensorboard", "wandb", "trackio"]] = Field(
        default_factory=lambda: ["none"], description="experiment trackers every stage logs to (one name or a list)"
    )
    allow_changed_settings: bool = Field(
        False, description="let a command add to a file made with other settings (settings.json) instead of refusing"
    )
    generator: ModelConfig = _role(temperature=1.0, top_p=0.95)
    reference: ModelConfig = Field(
        default_factory=ModelConfig, description="null model = the generator's base model (frozen copy)"
    )
    solver: ModelConfig = _role(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=1024)
    domain: DomainConfig
    executor: ExecutorConfig = ExecutorConfig()
    generate: GenerateConfig = GenerateConfig()
    label: LabelConfig = LabelConfig()
    probe: ProbeConfig = ProbeConfig()
    reward: RewardConfig = RewardConfig()
    train: TrainConfig = TrainConfig()
    lora: LoraConfig = LoraConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    coevolve: CoevolveConfig = CoevolveConfig()
    rank: RankConfig = RankConfig()
    solve_train: SolveTrainConfig = SolveTrainConfig()
    self_train: SelfTrainConfig = SelfTrainConfig()
    rounds: RoundsConfig = RoundsConfig()

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker_or_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _reference_defaults_to_generator(self) -> PropelConfig:
        if self.reference.model is None:
            self.reference.model = self.generator.model
        return self


#: a URL anywhere in a string (a leading space, a command around it), and a scheme-less ``//host``
URL = re.compile(r"(?:\b[a-z][a-z0-9+.-]*:)?//(?P<authority>[^/?#\s]*)(?P<rest>[^\s]*)", re.IGNORECASE)
#: ``user:password@host`` with no scheme at all
BARE_USERINFO = re.compile(r"(?<![\w/@:.-])[\w.%+-]+:[^\s@/]+@(?:[\w-]+(?:\.[\w-]+)+|[\w-]+:\d+)")
#: schemes whose user before the host names an account, not a secret (``ssh://git@host``)
PLAIN_USER_SCHEMES = {"ssh", "git", "git+ssh", "sftp", "scp", "mailto", "docker"}
#: a query or fragment parameter is a secret when its name (lowercase, letters and digits only) is one
#: of these, holds one of the longer ones, or ends in ``token`` (``access_token``, not ``max_tokens``)
SECRET_NAMES = frozenset(
    {"key", "code", "session", "auth", "pass", "pw", "pwd", "sig", "sas", "token", "jwt", "hmac", "bearer"}
)
SECRET_PARTS = ("secret", "password", "passwd", "apikey", "accesskey", "privatekey", "credential", "signature", "hmac")


def _secret_parameter(name: str) -> bool:
    compact = re.sub(r"[^a-z0-9]", "", name.lower())
    return compact in SECRET_NAMES or compact.endswith("token") or any(part in compact for part in SECRET_PARTS)


def _has_credential(text: str) -> bool:
    """Whether a URL in ``text`` carries a credential: a password before the host, a user before it
    (but for ``ssh://git@host`` and the like), or a query or fragment parameter named as a secret."""
    from urllib.parse import unquote

    if BARE_USERINFO.search(text):
        return True
    for match in URL.finditer(text):
        authority, rest = match.group("authority"), match.group("rest")
        scheme = match.group(0).split("//", 1)[0].rstrip(":").lower()
        if "@" in authority:
            userinfo = unquote(authority.rsplit("@", 1)[0])
            if ":" in userinfo or (scheme and scheme not in PLAIN_USER_SCHEMES):
                return True
        for part in re.split(r"[?#&;]", unquote(rest))[1:]:
            if "=" in part and _secret_parameter(part.split("=", 1)[0]):
                return True
    return False


def url_credentials(data: Any) -> list[str]:
    """Where ``data`` (a config as read, at any depth, keys too) holds a URL with a credential: each
    a line naming the key, never the secret. Configs are copied into the run folder, its report and
    the console, so secrets stay out of them and are named by reference (``api_key_env``). A
    heuristic: a secret written into a URL's path (a webhook's) cannot be told from a path."""
    found = []
    pending = [(data, "")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                pending += [(item, f"{path}.{key}".lstrip(".")), (key, f"{path}.{key} (the key)".lstrip("."))]
        elif isinstance(value, list | tuple):
            pending += [(item, f"{path}[{i}]") for i, item in enumerate(value)]
        elif isinstance(value, str) and _has_credential(value):
            found.append(
                f"{readable(path)} holds a URL with a credential in it (a user or password before the host, or "
                "a secret query parameter): keep secrets out of configs, in an environment variable named by "
                "api_key_env"
            )
    return sorted(found)


def check_components(model: BaseModel, registry: Registry, prefix: str = "") -> list[str]:
    """Every field marked with ``component(kind)`` must name installed components of that kind, and
    every options field (``options_of``, ``options_by_name``) must suit the components it configures."""
    problems = []
    fields = type(model).model_fields
    for name, info in fields.items():
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            problems += check_components(value, registry, key + ".")
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "options_of" in extra:
            named = extra["options_of"]
            kind = fields[named].json_schema_extra["component"]
            if getattr(model, named) in registry.names(kind):
                problems += [f"{key}: {p}" for p in registry.check_options(kind, getattr(model, named), value)]
        if "options_by_name" in extra:
            kind = extra["options_by_name"]
            for item, options in value.items():
                known = item in registry.names(kind)
                problems += (
                    [f"{key}.{item}: {registry.unknown(kind, item)}"]
                    if not known
                    else [f"{key}.{item}: {p}" for p in registry.check_options(kind, item, options)]
                )
        kind = extra.get("component")
        if kind is None:
            continue
        installed = registry.names(kind)
        for item in value if isinstance(value, list) else [] if value is None else [value]:
            if item not in installed:
                problems.append(f"{key}: {registry.unknown(kind, item)}")
    return problems


def resolved(config: PropelConfig, registry: Registry) -> dict[str, Any]:
    """The config as JSON data with what its components run with spelled out: every options field
    filled with its components' defaults (``Registry.with_defaults``; a field of options by name also
    gets an entry for each component its section names, so the rule in use shows its defaults), and
    beside every field naming components a ``FIELD_plugins`` mapping each to the distribution and
    version that registered it (``Registry.made_by``). What ``RUN/settings.json`` records."""
    out = config.model_dump(mode="json")
    _spell_out(config, out, registry)
    return out


def spelled_out(config: PropelConfig, registry: Registry) -> tuple[dict[str, Any], dict[str, Any]]:
    """``resolved(config, registry)``, and what it adds to the config as given, flat (``a.b.c`` keys):
    the components' defaults and what registered each."""
    data = resolved(config, registry)
    given = flat(config.model_dump(mode="json"))
    return data, {key: value for key, value in flat(data).items() if key not in given}


def _spell_out(model: BaseModel, out: dict[str, Any], registry: Registry) -> None:
    fields = type(model).model_fields
    for name in fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            _spell_out(value, out[name], registry)
            continue
        extra = _extra(fields[name])
        if "options_of" in extra:
            named = extra["options_of"]
            kind, component = _extra(fields[named])["component"], getattr(model, named)
            if component in registry.names(kind):
                out[name] = registry.with_defaults(kind, component, out[name])
        if "options_by_name" in extra:
            kind = extra["options_by_name"]
            used = [
                item
                for other in fields
                if _extra(fields[other]).get("component") == kind
                for item in _named(model, other)
            ]
            out[name] = {
                item: registry.with_defaults(kind, item, out[name].get(item, {}))
                for item in [*out[name], *[item for item in used if item not in out[name]]]
                if item in registry.names(kind)
            }
        if "component" in extra:
            kind = extra["component"]
            out[f"{name}_plugins"] = {
                item: registry.made_by(kind, item) for item in _named(model, name) if item in registry.names(kind)
            }


def _extra(info: Any) -> dict[str, Any]:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _named(model: BaseModel, name: str) -> list[str]:
    """The component names a field holds: a list's items, a name, or none."""
    value = getattr(model, name)
    return list(value) if isinstance(value, list) else [] if value is None else [value]


#: settings that moved to a section of their own, for the error a config with the old key gets
MOVED = {
    "train.lora_r": "lora.r",
    "train.lora_alpha": "lora.alpha",
    "train.lora_dropout": "lora.dropout",
    "train.lora_target_modules": "lora.target_modules",
    "train.checkpoint_every": "checkpoint.every",
    "train.resume": "checkpoint.resume",
}


def format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        key = ".".join(str(part) for part in loc) or "(top level)"
        if err["type"] == "extra_forbidden" and key in MOVED:
            lines.append(f"{key}: this setting is {MOVED[key]} now")
        elif err["type"] == "extra_forbidden":
            fields = sorted(_section_at(loc[:-1]).model_fields)
            lines.append(f"{key}: unknown key; valid keys here: {', '.join(fields)}")
        elif err["type"] == "missing":
            lines.append(f"{key}: required key is missing")
        elif err["type"] == "value_error" and isinstance(err.get("input"), dict):  # a section's own check
            lines.append(f"{'config' if not loc else key}: {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{key} = {err.get('input')!r}: {err['msg']}")
    return "invalid config:\n" + "\n".join(f"  - {line}" for line in lines)


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    model: type[BaseModel] = PropelConfig
    for part in loc:
        if isinstance(part, int):  # an index into a list of sections
            continue
        annotation = model.model_fields[part].annotation
        candidates = (annotation, *typing.get_args(annotation))
        model = next(a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel))
    return model


def dump_config(config: PropelConfig, registry: Registry) -> str:
    """The resolved config as YAML, as ``propel config`` prints it and ``RUN/config.yaml`` keeps it, then
    as comments what its components run with beyond it (``resolved``): the options left at their
    defaults, and the distribution and version that registered each component. The comments are not
    read back, so the YAML stays a config that takes overrides (another sandbox, another sampler)
    and a plugin's new defaults."""
    import yaml

    _, spelled = spelled_out(config, registry)
    defaults = [f"#   {key}: {json.dumps(value)}" for key, value in spelled.items() if "_plugins." not in key]
    made_by = [
        f"#   {key.split('_plugins.')[0]}: {key.split('_plugins.')[1]}: {value}"
        for key, value in spelled.items()
        if "_plugins." in key
    ]
    return (
        yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
        + "# options at their defaults:\n"
        + "".join(line + "\n" for line in defaults)
        + "# the components named above, and what registered them:\n"
        + "".join(line + "\n" for line in made_by)
    )
