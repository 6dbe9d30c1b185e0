"""Reading a config, and the plans it gives the library: one frozen plan per entry point, holding every
setting the call needs, derived ones included.

``load_config`` reads YAML files and overrides; ``validate_config`` checks the settings, the
components they name, and then builds every plan (``plans_of``), so a derived setting that cannot work
(``evaluate.k`` below ``label.min_valid_attempts``: every evaluation label unknown, after the solver's
whole cost) is refused by ``propel config`` and before any stage starts. A recipe (a stage, a
benchmark, a script) takes its plan from ``Run.plans``, or builds one with another folder or seed by
the same builder, and hands it to the library with the run's :class:`~propel_core.services.Services`.

=======================  ===========================================  ==================================
plan                     library entry point                           built by
=======================  ===========================================  ==================================
:class:`LabelPlan`       ``label_tasks``, ``solver_labels``,          ``label_plan``
                         ``sample_and_label``
:class:`AuditPlan`       ``audit_of``                                  ``generator_plan``
:class:`GeneratorPlan`   ``train_generator`` (train, coevolve)         ``generator_plan``
:class:`SolverPlan`      ``train_solver`` (solve-train)               ``solver_plan``
:class:`SelfTrainPlan`   ``fine_tune_solver`` (self-train)            ``self_train_plan``
:class:`SweepPlan`       ``sweep``, ``save_selected``                  ``sweep_plan``
:class:`EvaluationPlan`  the evaluate stage's arms                     ``evaluation_plan``
:class:`SamplerPlan`     a context sampler (``sampler(services)``)     ``sampler_plan``
:class:`RoundPlan`       one round of ``propel rounds``                ``round_plan``
=======================  ===========================================  ==================================
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from propel_core.config import (
    AuditConfig,
    ConfigError,
    LabelConfig,
    LoraConfig,
    ModelConfig,
    ProbeConfig,
    PropelConfig,
    RewardConfig,
    RoundsConfig,
    SelfTrainConfig,
    SolveTrainConfig,
    TrainConfig,
    check_components,
    format_errors,
    readable,
    url_credentials,
)
from propel_core.evaluation import evaluation_seed
from propel_core.plugins import Registry

if TYPE_CHECKING:
    from propel_core.contracts import ContextSampler
    from propel_core.services import Services

#: the configs shipped with propel, found by name (``propel run small/countdown``, ``load_config("demo")``)
BUILT_IN_CONFIGS = files("propel_core") / "configs"

log = logging.getLogger("propel")


@dataclass(frozen=True)
class SamplerPlan:
    """A context sampler: the component ``name`` with its ``options``, seeded ``seed``."""

    name: str
    options: dict[str, Any]
    seed: int

    def sampler(self, services: Services) -> ContextSampler:
        """A fresh sampler over the domain's contexts."""
        return services.registry.context_sampler(self.name, services.domain().contexts(), self.seed, **self.options)


@dataclass(frozen=True)
class LabelPlan:
    """How tasks are labeled: ``label.k`` attempts each by ``solver``, attempt ``j`` of task ``t``
    seeded from ``seed``, each label's band and gradable minimum as ``label`` says; ``description``
    names the work on its progress bar."""

    solver: ModelConfig
    label: LabelConfig
    seed: int
    description: str = "label"


@dataclass(frozen=True)
class AuditPlan:
    """``train.audit``: ``options``, and the labels its audits make (``labels``, at ``train.audit.k``)."""

    options: AuditConfig
    labels: LabelPlan


@dataclass(frozen=True)
class GeneratorPlan:
    """A GRPO training of the generator into ``folder``: ``generator`` with ``lora``, the ``train``
    settings, the ``reward`` rule and probes, contexts from ``contexts``; ``seed`` seeds the trainer;
    ``solve`` labels tasks live for a rule reading solver utility; ``audit`` (or None) audits the
    policy's own tasks. A checkpoint every
    ``checkpoint_every`` steps; ``resume`` goes on from the last one."""

    folder: Path
    generator: ModelConfig
    train: TrainConfig
    lora: LoraConfig
    reward: RewardConfig
    contexts: SamplerPlan
    seed: int
    checkpoint_every: int
    resume: bool
    solve: LabelPlan
    audit: AuditPlan | None

    def with_probes(self, probes: list[Path]) -> GeneratorPlan:
        """This plan with extra probe bundles for its rule (co-evolution's, trained after the config is read)."""
        return replace(self, reward=self.reward.model_copy(update={"probes": [str(path) for path in probes]}))


@dataclass(frozen=True)
class SolverPlan:
    """solve-train: RL on the solver (``solver`` with ``lora``) as ``options`` say, into ``folder``;
    ``reward`` is the reward section its rule (``options.reward_rule``) gets, r_bad settled on the
    paper's scale; ``band`` the label band its verified corpus is marked with."""

    folder: Path
    options: SolveTrainConfig
    solver: ModelConfig
    lora: LoraConfig
    reward: RewardConfig
    band: tuple[float, float]
    seed: int
    checkpoint_every: int
    resume: bool


@dataclass(frozen=True)
class SelfTrainPlan:
    """self-train: supervised fine-tuning of ``solver`` with ``lora`` as ``options`` say, into ``folder``."""

    folder: Path
    options: SelfTrainConfig
    solver: ModelConfig
    lora: LoraConfig
    seed: int


@dataclass(frozen=True)
class SweepPlan:
    """The probe sweep: ``probe`` settings over the activations of ``reference``; RVP pays each cell's
    head by the rule of ``reward``."""

    probe: ProbeConfig
    reference: ModelConfig
    reward: RewardConfig


@dataclass(frozen=True)
class EvaluationPlan:
    """The evaluation, into ``folder``: ``num_tasks`` contexts from ``contexts`` for every arm of
    ``generator``, their valid tasks labeled as ``labels`` says (K = ``evaluate.k``, the label
    section's band and minimum); ``adapter`` names the trained arm; ``seed`` seeds the paired
    comparisons."""

    folder: Path
    generator: ModelConfig
    contexts: SamplerPlan
    num_tasks: int
    labels: LabelPlan
    adapter: str
    seed: int


@dataclass(frozen=True)
class RoundPlan:
    """Round ``number`` of ``propel rounds``, into ``folder`` (``RUN/rounds/rN``), seeded ``seed``: the
    generator trained against ``probe`` (``train``, from the last round's adapter), the ``tasks``
    contexts it writes from, the solver trained on the probe's in-band ones (``solve``, from the last
    round's adapter), and its ``labels`` of a sample of them (``previous``: the same tasks labeled by
    the solver the round started with, when audited). Every round's held-out evaluation, and the base
    solver's, is seeded ``held_out_seed``, so scores compare attempt by attempt across rounds and runs.
    With ``rounds.trace`` its generator's contexts
    (``train.contexts``, ``tasks``) carry a trace of the last round's labels (round 1: the corpus's)."""

    number: int
    folder: Path
    options: RoundsConfig
    probe: ProbeConfig
    seed: int
    held_out_seed: int
    train: GeneratorPlan
    tasks: SamplerPlan
    solve: SolverPlan
    labels: LabelPlan
    previous: LabelPlan | None


@dataclass(frozen=True)
class Plans:
    """Every plan of a config, as ``Run.plans`` holds them."""

    label: LabelPlan
    sweep: SweepPlan
    train: GeneratorPlan
    coevolve: GeneratorPlan
    evaluate: EvaluationPlan
    solve_train: SolverPlan
    self_train: SelfTrainPlan
    rounds: RoundPlan


def sampler_plan(config: PropelConfig, seed: int) -> SamplerPlan:
    """The generator's contexts: ``generate.context_sampler`` with its options, seeded ``seed``."""
    generate = config.generate
    return SamplerPlan(generate.context_sampler, dict(generate.sampler_options), seed)


def label_plan(
    config: PropelConfig, k: int | None = None, setting: str = "label.k", seed: int | None = None, description="label"
) -> LabelPlan:
    """The label section's labels at ``k`` attempts (the setting ``setting``; None: ``label.k``),
    seeded ``seed`` (None: the run's). Refused when ``label.min_valid_attempts`` exceeds that K: every
    label would leave utility unknown."""
    label = config.label
    k = label.k if k is None else k
    if k < label.min_valid_attempts:
        raise ConfigError(
            f"{setting} ({k}) is below label.min_valid_attempts ({label.min_valid_attempts}), so every label it "
            f"makes would leave utility unknown; raise {setting} or lower label.min_valid_attempts"
        )
    at_k = label.model_copy(update={"k": k})  # K was the one setting of the section's checks left to check
    return LabelPlan(config.solver, at_k, config.seed if seed is None else seed, description)


def generator_plan(
    config: PropelConfig, folder: Path | None = None, seed: int | None = None, rule: str | None = None
) -> GeneratorPlan:
    """The train stage's plan (``RUN/train``, the run's seed, ``reward.rule``), or another training's:
    into ``folder``, seeded ``seed`` (its contexts, trainer, live labels and audit alike), paid by
    ``rule`` (None: ``reward.rule``); audited when ``train.audit.every`` is set. Another seed or
    folder is another plan from this builder, not a ``replace`` of one: the seed is in its parts too."""
    seed = config.seed if seed is None else seed
    train, audit = config.train, config.train.audit
    generation_batch = train.per_device_batch * train.gradient_accumulation
    if generation_batch % train.group_size:
        raise ConfigError(
            f"train.per_device_batch x train.gradient_accumulation ({generation_batch}) must be a multiple of "
            f"train.group_size ({train.group_size}): a step's completions are whole groups"
        )
    audit_labels = label_plan(config, audit.k, "train.audit.k", seed, "audit")
    reward = config.reward if rule is None else config.reward.model_copy(update={"rule": rule})
    return GeneratorPlan(
        folder=config.run_dir / "train" if folder is None else folder,
        generator=config.generator,
        train=config.train,
        lora=config.lora,
        reward=reward,
        contexts=sampler_plan(config, seed),
        seed=seed,
        checkpoint_every=config.checkpoint.every,
        resume=config.checkpoint.resume,
        solve=label_plan(config, seed=seed, description="solver in the loop"),
        audit=AuditPlan(audit, audit_labels) if audit.every else None,
    )


def coevolve_plan(config: PropelConfig) -> GeneratorPlan:
    """Co-evolution's retraining (``RUN/coevolve/train``): the ``coevolve.mode`` rule, started over,
    not audited; its extra probes are added once trained (``GeneratorPlan.with_probes``)."""
    plan = generator_plan(config, config.run_dir / "coevolve" / "train", rule=config.coevolve.mode)
    return replace(plan, resume=False, audit=None)


def solver_plan(config: PropelConfig) -> SolverPlan:
    """solve-train's plan (``RUN/solve/NAME``): its rules read verdicts (markers, verifier_score),
    never a logit, so r_bad keeps the paper's scale."""
    options = config.solve_train
    if options.replay.strategy != "none" and options.algorithm != "grpo":
        raise ConfigError("solve_train.replay works with solve_train.algorithm: grpo (TRL's RLOO has no replay here)")
    if options.baseline == options.name:
        raise ConfigError(
            f"solve_train.baseline names this run itself ({options.name!r}): name another solve run to compare with"
        )
    if options.context_sampler == "trace":
        raise ConfigError(
            "solve_train.context_sampler: trace conditions the generator's prompt on attempted tasks, and "
            "solve-train's prompts are the solver's (the tasks themselves), which show no trace; "
            "choose uniform or progress"
        )
    return SolverPlan(
        folder=config.run_dir / "solve" / options.name,
        options=options,
        solver=config.solver,
        lora=config.lora,
        reward=config.reward.settled(False, None),
        band=(config.label.band_low, config.label.band_high),
        seed=config.seed,
        checkpoint_every=config.checkpoint.every,
        resume=config.checkpoint.resume,
    )


def round_seed(seed: int, number: int) -> int:
    """The seed of round ``number`` of a run seeded ``seed``: its contexts, trainings and labels."""
    return zlib.crc32(f"{seed}/round/{number}".encode())


def round_plan(
    config: PropelConfig,
    number: int = 1,
    probe: Path | None = None,
    generator_adapter: Path | None = None,
    solver_adapter: Path | None = None,
) -> RoundPlan:
    """Round ``number``: its generator starts from ``generator_adapter`` and is paid by the probe bundle
    ``probe`` (None: the run's selected one), its solver starts from ``solver_adapter`` (None: the base
    solver, round 1). Its trainings never audit (the round labels the tasks its generator writes) and
    resume from their last checkpoint."""
    options, seed = config.rounds, round_seed(config.seed, number)
    folder = config.run_dir / "rounds" / f"r{number}"
    reward = config.reward.model_copy(update={"main_probe": str(probe) if probe else config.reward.main_probe})
    train = generator_plan(config, folder / "train", seed)
    contexts = train.contexts
    if options.trace:  # what the solver did with the last round's tasks (round 1: with the corpus)
        if contexts.name not in ("uniform", "progress"):
            raise ConfigError(
                f"rounds.trace wraps generate.context_sampler in the trace sampler, which wraps uniform or progress, "
                f"not {contexts.name}; set generate.context_sampler to one of them, or rounds.trace: false"
            )
        last = config.run_dir / "labels.jsonl" if number == 1 else folder.with_name(f"r{number - 1}") / "labels.jsonl"
        traced = {"inner": contexts.name, "inner_options": contexts.options, "trace": str(last)}
        contexts = SamplerPlan("trace", traced, seed)
    generator = config.generator.with_adapter(generator_adapter)
    train = replace(train, generator=generator, reward=reward, contexts=contexts, audit=None, resume=True)
    solve = replace(
        solver_plan(config),
        folder=folder / "solve",
        solver=config.solver.with_adapter(solver_adapter),
        seed=seed,
        resume=True,
    )
    # a rule reading live solver utility (solver_in_the_loop) asks the solver the round starts from
    train = replace(train, solve=replace(train.solve, solver=solve.solver))
    labels = label_plan(config, seed=seed, description=f"round {number} labels")
    trained = replace(labels, solver=config.solver.with_adapter(folder / "solve" / "adapter"))
    previous = replace(labels, solver=solve.solver, description=f"round {number} labels, solver before")
    return RoundPlan(
        number=number,
        folder=folder,
        options=options,
        probe=config.probe,
        seed=seed,
        held_out_seed=round_seed(config.seed, 0),
        train=train,
        tasks=contexts,
        solve=solve,
        labels=trained,
        previous=previous if options.audit_previous else None,
    )


def self_train_plan(config: PropelConfig) -> SelfTrainPlan:
    return SelfTrainPlan(config.run_dir / "self_train", config.self_train, config.solver, config.lora, config.seed)


def sweep_plan(config: PropelConfig) -> SweepPlan:
    return SweepPlan(config.probe, config.reference, config.reward)


def evaluation_plan(config: PropelConfig, shift: int = 0) -> EvaluationPlan:
    """The evaluate stage's plan: contexts and attempts seeded by the evaluation seed (shifted by
    ``shift``, one evaluation per RL seed), labels at ``evaluate.k``."""
    seed = evaluation_seed(config.seed, shift)
    evaluate = config.evaluate
    if evaluate.adapter == "best_audited" and not config.train.audit.every:
        raise ConfigError(
            "evaluate.adapter: best_audited is the adapter the audits of training keep, and train.audit.every is 0 "
            "(no audit): set train.audit.every, or evaluate.adapter: final"
        )
    return EvaluationPlan(
        folder=config.run_dir / "eval",
        generator=config.generator,
        contexts=sampler_plan(config, seed),
        num_tasks=evaluate.num_tasks,
        labels=label_plan(config, evaluate.k, "evaluate.k", seed, "evaluate"),
        adapter=evaluate.adapter,
        seed=config.seed,
    )


def plans_of(config: PropelConfig) -> Plans:
    """Every plan of ``config``, each derived setting checked; a conflict is a :class:`ConfigError`
    naming the settings."""
    return Plans(
        label=label_plan(config),
        sweep=sweep_plan(config),
        train=generator_plan(config),
        coevolve=coevolve_plan(config),
        evaluate=evaluation_plan(config),
        solve_train=solver_plan(config),
        self_train=self_train_plan(config),
        rounds=round_plan(config),
    )


def built_in_configs() -> dict[str, Path]:
    """The shipped configs by the name a command finds them by: ``demo``, ``small/countdown``, ..."""
    folder = Path(str(BUILT_IN_CONFIGS))
    return {path.relative_to(folder).with_suffix("").as_posix(): path for path in sorted(folder.rglob("*.yaml"))}


def config_file(config: str | Path) -> Path:
    """The file ``config`` names: itself where it is a file, else the built-in config of that name
    (:func:`built_in_configs`); ConfigError, listing the built-in names, where it is neither."""
    built_in = built_in_configs()
    if Path(config).is_file():
        return Path(config)
    if str(config) in built_in:
        return built_in[str(config)]
    raise ConfigError(f"config file {config} does not exist, nor is it a built-in config: {', '.join(built_in)}")


def load_config(
    paths: list[str | Path] | str | Path, overrides: list[str] = (), registry: Registry | None = None
) -> PropelConfig:
    """Merge YAML files and dotlist overrides, validate, check component names and build the plans.

    A path that is no file but names a built-in config (``small/arithmetic``) is that config's file.
    ``registry`` defaults to one built from the installed plugins.
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(paths, str | Path):
        paths = [paths]
    try:
        layers = []
        for path in paths:
            layers.append(OmegaConf.load(config_file(path)))
        for override in overrides:
            if readable(override) != override:  # YAML text is Unicode; an undecodable file name is not
                raise ConfigError(f"override {readable(override)} is not valid UTF-8 (a file name's bytes?)")
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        data = OmegaConf.to_container(OmegaConf.merge(*layers), resolve=True)
    except (OmegaConfBaseException, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config: {' '.join(readable(str(exc)).split())}") from None
    return validate_config(data or {}, registry)


def validate_config(data: dict[str, Any], registry: Registry | None = None) -> PropelConfig:
    """``data`` as a config: its settings, the components they name, and every plan built from it."""
    if problems := url_credentials(data):
        raise ConfigError("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))
    try:
        config = PropelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc)) from None
    problems = check_components(config, registry or Registry.build())
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))
    try:
        plans = plans_of(config)
    except ConfigError as exc:
        raise ConfigError(f"invalid config:\n  - {exc}") from None
    _warn_of_derived_bands(config, plans)
    return config


def _warn_of_derived_bands(config: PropelConfig, plans: Plans) -> None:
    """The label section's warning of a band no solve rate reaches, for the labels made at another K
    (``evaluate.k``, ``train.audit.k``): said once, when the config is read."""
    audit = plans.train.audit
    derived = [("evaluate.k", plans.evaluate.labels), ("train.audit.k", audit.labels if audit else None)]
    for setting, labels in derived:
        if labels is None or labels.label.k == config.label.k or labels.label.reachable_in_band():
            continue
        log.warning(
            "%s: no solve rate that k=%d attempts can give lies in the band [%.4g, %.4g], so every label it makes "
            "will be out of band; raise %s or widen label.band_low/band_high",
            setting,
            labels.label.k,
            config.label.band_low,
            config.label.band_high,
            setting,
        )
