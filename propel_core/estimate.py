"""What a config will spend, before it runs: per stage, the generations, solver attempts, GRPO
rollouts and completion tokens its plans (:mod:`propel_core.plans`) call for, and the minutes they
take at the rates this project's benchmarks measured on its 2-core CPU (:data:`RATES`, each with its
source). ``propel config`` prints it (:func:`estimate_lines`).

Every count is a bound: every generation taken for valid (so labeled), every completion run to its
token limit, every audit full. Minutes come from measured rates only: a role on another model,
backend or device, or a domain whose checks no benchmark timed, leaves the minutes of the stages it
takes part in unknown, and a note says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from propel_core.config import ModelConfig, PropelConfig
from propel_core.plans import GeneratorPlan, Plans
from propel_core.plugins import Registry


@dataclass(frozen=True)
class Rate:
    """``seconds`` per ``unit`` of the embedded SmolLM2-135M (transformers backend, float32), as
    ``source`` measured it on this project's 2-core CPU."""

    seconds: float
    unit: str
    source: str


RATES = {
    "generation": Rate(
        234 / (1024 * 20),
        "token of a generation's limit",
        "frontier_shift.py's corpus (docs/experiment.md, 2026-11-23): 1,024 arithmetic generations of up to 20 "
        "tokens in 3.9 min, batch 64",
    ),
    "attempt": Rate(
        1 / (5.95 * 16),
        "token of an attempt's limit",
        "vllm_label.py's transformers arm (docs/scaling.md): 5.95 attempts/s of up to 16 tokens, the demo's "
        "solver, 64 workers",
    ),
    "rollout": Rate(
        13.0 / (8 * 20),
        "token of a GRPO rollout's limit",
        "train_busy.py (2026-12-07): a demo step, 8 rollouts of up to 20 tokens with the probe reward, 13.0 s "
        "(median, nearly idle)",
    ),
    "extract": Rate(
        18 / (768 * 20),
        "token of a task the reference reads (the generator's limit)",
        "frontier_shift_lm.yaml's run (docs/experiment.md): 768 arithmetic tasks of up to 20 tokens in 18 s",
    ),
    "probe": Rate(
        44.9 / (48 * 4920),
        "row of one probe head's fit",
        "probe_sweep.py: 48 cells on 4,920 rows in 44.9 s",
    ),
}

#: how much slower than the transformers backend a model backend samples, where a benchmark measured
#: it here (a factor on the rates above), and the source
BACKENDS = {
    "transformers": (1.0, ""),
    "vllm": (1 / 0.88, "vllm_label.py: the vllm backend at 0.88x the transformers backend's attempts/s (median)"),
    "arithmetic_skill": (0.0, "the simulated solver answers in microseconds (docs/experiment.md)"),
}


@dataclass(frozen=True)
class Checks:
    """Seconds a domain's grading adds to an attempt (``attempt``) and its validity checks to a
    generation (``generation``), beyond the model's time; None: not timed. ``source`` says where."""

    attempt: float | None
    generation: float | None
    source: str


IN_PROCESS = Checks(0.0, 0.0, "checked in the process, within the rates above")
#: a domain not here has checks no benchmark timed
CHECKS = {
    "arithmetic": IN_PROCESS,
    "countdown": IN_PROCESS,
    "azr": Checks(1 / 16.2, 1 / 16.2, "sandbox.py: 15.6-16.8 sandboxed AZR runs/s"),
    "mle": Checks(
        2.91, 2.91, "mle_cost.py: the verifier 2.91 s a script (median); a task's check runs its reference script"
    ),
    "math": Checks(None, None, "its verifier runs in a subprocess and its oracle check samples a model: not timed"),
    "swe": Checks(
        None,
        None,
        "an attempt is a multi-turn agent episode, its turns and commands not timed (swe_timings.py: grading a fix "
        "1.47 s, re-verifying a valid bug 9.5 s; docs/recipes.md#estimate-what-a-swe-run-costs)",
    ),
}


#: what a stage's row counts, in the table's order (then its minutes)
COUNTS = ("generations", "attempts", "rollouts", "tokens")


@dataclass
class Stage:
    """What one stage spends: counts, completion tokens (their limits) and seconds (None: unknown)."""

    name: str
    generations: int = 0
    attempts: int = 0
    rollouts: int = 0
    tokens: int = 0
    seconds: float | None = 0.0

    def add(self, seconds: float | None) -> None:
        self.seconds = None if seconds is None or self.seconds is None else self.seconds + seconds


@dataclass
class Estimate:
    """The pipeline's stages (``propel run``), the follow-ups', and why some minutes are unknown or scaled."""

    stages: list[Stage]
    follow_ups: list[Stage]
    notes: list[str] = field(default_factory=list)

    def stage(self, name: str) -> Stage:
        return next(stage for stage in [*self.stages, *self.follow_ups] if stage.name == name)

    @property
    def total(self) -> Stage:
        """The pipeline's stages summed; seconds sum the known ones (:attr:`complete` says whether all were)."""
        counts = {name: sum(getattr(stage, name) for stage in self.stages) for name in COUNTS}
        return Stage("total", **counts, seconds=sum(stage.seconds or 0.0 for stage in self.stages))

    @property
    def complete(self) -> bool:
        return all(stage.seconds is not None for stage in self.stages)


class _Costs:
    """Adds a stage's work to it, at the rates its role and domain have; notes what is unknown or scaled."""

    def __init__(self, config: PropelConfig) -> None:
        self.notes: dict[str, None] = {}
        domain = config.domain.name
        self.checks = CHECKS.get(domain, Checks(None, None, "no benchmark timed its checks"))
        if self.checks is not IN_PROCESS:
            self.note(f"domain {domain}: {self.checks.source}")

    def factor(self, role: ModelConfig, name: str) -> float | None:
        """The role's time as a multiple of the embedded model's measured rates, or None (noted why)."""
        speed = BACKENDS.get(role.backend)
        if speed is None:
            return self.unknown(
                f"{name}: the {role.backend} backend was not timed here; its speed is its server's or its own"
            )
        if role.backend != "arithmetic_skill" and role.model is not None:
            return self.unknown(f"{name}: {role.model} was not timed here; the rates are the embedded SmolLM2-135M's")
        if role.device not in ("auto", "cpu"):
            return self.unknown(f"{name}: on {role.device}; the rates are a 2-core CPU's")
        if speed[1]:
            self.note(f"{name}: {speed[1]}")
        return speed[0]

    def note(self, text: str) -> None:
        self.notes[text] = None  # each once, in the order first said

    def unknown(self, text: str) -> None:
        self.note(text)

    def generations(self, stage: Stage, count: int, generator: ModelConfig) -> None:
        tokens = generator.sampling.max_new_tokens
        stage.generations += count
        stage.tokens += count * tokens
        self._spend(stage, count, tokens, "generation", self.factor(generator, "generator"), self.checks.generation)

    def attempts(self, stage: Stage, count: int, solver: ModelConfig) -> None:
        tokens = solver.sampling.max_new_tokens
        stage.attempts += count
        stage.tokens += count * tokens
        self._spend(stage, count, tokens, "attempt", self.factor(solver, "solver"), self.checks.attempt)

    def rollouts(self, stage: Stage, count: int, tokens: int, policy: ModelConfig, name: str, check: float | None):
        stage.rollouts += count
        stage.tokens += count * tokens
        self._spend(stage, count, tokens, "rollout", self.factor(policy, name), check)

    @staticmethod
    def _spend(stage: Stage, count: int, tokens: int, rate: str, factor: float | None, check: float | None) -> None:
        known = factor is not None and check is not None
        stage.add(count * (tokens * RATES[rate].seconds * factor + check) if known else None)


def estimate(config: PropelConfig, plans: Plans, registry: Registry) -> Estimate:
    """What ``config`` spends, stage by stage, from its ``plans``; ``registry`` builds the reward rule
    to ask whether it runs the solver during training."""
    costs = _Costs(config)
    corpus = config.generate.num_tasks
    generate, label, extract, probe, evaluate = (
        Stage(name) for name in ("generate", "label", "extract", "probe", "evaluate")
    )
    costs.generations(generate, corpus, config.generator)
    costs.attempts(label, corpus * plans.label.label.k, plans.label.solver)
    reference = costs.factor(config.reference, "reference")
    read = corpus * config.generator.sampling.max_new_tokens
    extract.add(None if reference is None else read * RATES["extract"].seconds * reference)
    sweep = plans.sweep.probe
    cells = len(sweep.layers) * len(sweep.poolings) * len(sweep.architectures) * len(sweep.balance)
    fits = cells * len(sweep.seeds) * (sweep.folds if sweep.split == "grouped_kfold" else 1)
    probe.add(fits * corpus * RATES["probe"].seconds)
    arms = 2 * plans.evaluate.num_tasks  # base and trained; a co-evolved adapter adds a third arm
    costs.generations(evaluate, arms, plans.evaluate.generator)
    costs.attempts(evaluate, arms * plans.evaluate.labels.label.k, plans.evaluate.labels.solver)
    train = _training("train", plans.train, costs, registry)
    stages = [generate, label, extract, probe, train, evaluate, Stage("report")]
    return Estimate(stages, _follow_ups(config, plans, costs, registry), list(costs.notes))


def _training(name: str, plan: GeneratorPlan, costs: _Costs, registry: Registry) -> Stage:
    """A GRPO training of the generator: its rollouts, the solver attempts of a rule reading live
    solver utility (K at each rollout) and of its audits."""
    stage = Stage(name)
    train = plan.train
    per_step = train.per_device_batch * train.gradient_accumulation
    rollouts = train.steps * per_step
    costs.rollouts(stage, rollouts, train.max_completion_length, plan.generator, "generator", costs.checks.generation)
    rule = registry.reward_rule(plan.reward.rule, plan.reward.settled(False, None))
    if "solver_utility" in rule.needs:
        costs.attempts(stage, rollouts * plan.solve.label.k, plan.solve.solver)
    if plan.audit is not None:
        audits = math.ceil(train.steps / plan.audit.options.every)  # steps 0, every, 2 x every, ...
        tasks = min(plan.audit.options.tasks, per_step)
        costs.attempts(stage, audits * tasks * plan.audit.labels.label.k, plan.audit.labels.solver)
    return stage


def _follow_ups(config: PropelConfig, plans: Plans, costs: _Costs, registry: Registry) -> list[Stage]:
    coevolve = _training("coevolve", plans.coevolve, costs, registry)
    solve = Stage("solve-train")
    options = plans.solve_train.options
    rollouts = options.steps * options.per_device_batch
    costs.rollouts(
        solve, rollouts, options.max_completion_length, plans.solve_train.solver, "solver", costs.checks.attempt
    )
    costs.attempts(solve, 2 * options.held_out_tasks * options.eval_k, plans.solve_train.solver)  # base, trained
    self_train = Stage("self-train")
    costs.attempts(self_train, config.generate.num_tasks * plans.self_train.options.k, plans.self_train.solver)
    self_train.add(None)
    rank = Stage("rank", seconds=None)
    rounds = _rounds(plans, costs)
    costs.note("coevolve: its extra probes are not counted; evaluate then has a third arm (the co-evolved)")
    costs.note("self-train: counted on the corpus (generate.num_tasks tasks); its fine-tuning was not timed")
    costs.note("rank: the ranker's training was not timed (mle_cost.py timed its scoring only)")
    costs.note("rounds: its probe refits are not counted (one head at one cell on the labels so far: seconds)")
    return [coevolve, solve, self_train, rank, rounds]


def _rounds(plans: Plans, costs: _Costs) -> Stage:
    """``propel rounds``: per round the generator's training (``rounds.generator`` says in which),
    its tasks, the labeled sample (twice when audited), the solver's training and the held-out
    evaluation (the base solver's once more)."""
    stage, plan = Stage("rounds"), plans.rounds
    options, train, solve = plan.options, plan.train.train, plan.solve.options
    trainings = {"every_round": options.num_rounds, "first_round": 1, "base": 0}[options.generator]
    steps = trainings * train.steps * train.per_device_batch * train.gradient_accumulation
    check = costs.checks.generation
    costs.rollouts(stage, steps, train.max_completion_length, plan.train.generator, "generator", check)
    costs.generations(stage, options.num_rounds * options.tasks, plan.train.generator)
    sample = options.num_rounds * options.label_budget * plan.labels.label.k
    costs.attempts(stage, sample * (2 if plan.previous else 1), plan.labels.solver)
    rollouts = options.num_rounds * solve.steps * solve.per_device_batch
    costs.rollouts(stage, rollouts, solve.max_completion_length, plan.solve.solver, "solver", costs.checks.attempt)
    costs.attempts(stage, (options.num_rounds + 1) * options.held_out_tasks * solve.eval_k, plan.solve.solver)
    return stage


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes = seconds / 60
    return f"{minutes:,.0f}" if minutes >= 10 else f"{minutes:.1f}"


def _row(name: str, counts: list[str], minutes: str) -> str:
    return f"  {name:<12}" + "".join(f"{count:>12}" for count in counts) + f"{minutes:>11}"


def _stage_row(stage: Stage, minutes: str) -> str:
    return _row(stage.name, [f"{getattr(stage, count):,}" for count in COUNTS], minutes)


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f" ({hours / 24:.1f} days)" if hours >= 48 else f" ({hours:.1f} h)" if hours >= 1 else ""


#: what no rate counts: a stage's start (Python, torch, the plugins) and its model loads; measured on
#: small/arithmetic, whose work the rates put at 1.0 minutes and whose run took 3.9 (docs/domains.md)
NOT_COUNTED = (
    "not counted: starting each stage and loading its models, tens of seconds a stage on this CPU, which is "
    "most of a small config's time (small/arithmetic: 1.0 minutes estimated, 3.9 measured at load 3-6)"
)


def estimate_lines(found: Estimate) -> list[str]:
    """The estimate as ``propel config`` prints it: a table of the stages and their total, the
    follow-ups, the notes and the rates with their sources."""
    total = found.total
    known = _minutes(total.seconds) if found.complete else f">={_minutes(total.seconds)}" if total.seconds else "?"
    lines = [
        "what this config spends, at most (every generation valid, every completion at its token limit), at the "
        "rates measured on this project's 2-core CPU (benchmarks/README.md):",
        _row("stage", list(COUNTS), "minutes"),
        *(_stage_row(stage, _minutes(stage.seconds)) for stage in found.stages),
        _stage_row(total, known) + _duration(total.seconds),
        f"  {NOT_COUNTED}",
        "  follow-ups, each run on its own on a finished run:",
        *(_stage_row(stage, _minutes(stage.seconds)) for stage in found.follow_ups),
    ]
    lines += ["unknown or scaled minutes:", *(f"  - {note}" for note in found.notes)]
    lines += ["rates (the embedded SmolLM2-135M, transformers backend):"]
    lines += [f"  - {name}: {rate.seconds:.3g} s a {rate.unit}: {rate.source}" for name, rate in RATES.items()]
    return lines
