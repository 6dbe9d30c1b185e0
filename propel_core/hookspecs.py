"""Every hook a propel plugin can implement.

This file is the reference for plugin authors. Each hook is a *contribution* hook: the core calls it
once per plugin while it builds the component registry (the first time a stage or ``propel plugins``
needs it), passing a ``register`` callback. A plugin calls ``register(name, component)`` once for each
component it contributes. The core owns the names: it records which plugin gave each component, and
two components of one kind under one name is an error that names both plugins.

Components are chosen by their registered name in config (``reward.rule: wco``). What ``component``
must be differs per kind and is given in each hook's docstring; in every case the core calls it, so
it may be a class, a function, or any callable. Specs only ever grow new arguments; an implementation
may accept fewer arguments than its spec (pluggy drops the rest), so old plugins keep working.

Heavy libraries (torch, transformers, trl) must be imported inside the component, never at module
import time: ``propel plugins`` imports every plugin and must answer in well under a second.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("propel")


@hookspec
def register_domains(register):
    """Contribute task domains (math, azr, countdown, swe, ...).

    Called once per plugin when the registry is built.

    ``register(name: str, factory)`` where ``factory(**options) -> propel_core.domain.Domain``. The
    options are the ``domain.options`` mapping of the config. The returned object implements the
    :class:`propel_core.domain.Domain` interface: contexts for the generator, the generator prompt,
    parsing a generation into a payload, rendering the text the reference model reads, the names of
    its validity predicates, the solver prompt, a grader for one solver attempt, and a topic.

    The core instantiates exactly one domain per run, the one named by ``domain.name``.
    """


@hookspec
def register_validity_predicates(register):
    """Contribute validity predicates W(x): cheap checks that a task is usable at all.

    ``register(name: str, predicate)`` where
    ``predicate(task: propel_core.records.Task, domain: Domain) -> propel_core.records.Validity``.
    The task arrives parsed (``task.payload`` is set); the predicate must never raise on bad input,
    it returns ``Validity(valid=False, reason=...)`` with a reason a person can act on. A predicate
    that computes facts later stages need (the AZR outputs of f) records them in ``task.payload``.

    A domain lists the predicate names it applies in ``Domain.validity_predicates``; the core runs
    them in that order after parsing and stops at the first rejection, whose reason is recorded on the
    task. Predicates are registered globally so that one domain can reuse another's.
    """


@hookspec
def register_model_backends(register):
    """Contribute model backends (``transformers``, ``vllm``, ``openai``, ...).

    ``register(name: str, factory)`` where ``factory(model: propel_core.config.ModelConfig)`` returns an
    object implementing :class:`propel_core.backend.ModelBackend`: ``generate(prompts, sampling, n=1,
    seed=None)`` (n completions per prompt in one batched call, with the caller's sampling knobs),
    ``hidden_states`` (hidden states at chosen layers), and ``model_id``.

    Each model role in config (``generator``, ``reference``, ``solver``) names its backend. The core
    creates one instance per model on first use (``Registry.backend``) and shares it between every
    role and component that names the same model.
    """


@hookspec
def register_poolers(register):
    """Contribute poolers that turn one task's hidden states into one vector.

    ``register(name: str, pooler)`` where
    ``pooler(hidden: Tensor[B, T, D], mask: Tensor[B, T]) -> Tensor[B, D']``. ``mask`` is 1 on real
    tokens and 0 on padding, which may sit on either side; padding must never reach the result.

    Probe sweeps name poolers in ``probe.poolings``; each name becomes one column of the sweep.
    """


@hookspec
def register_probe_architectures(register):
    """Contribute probe heads that map a pooled vector to a logit.

    ``register(name: str, factory)`` where ``factory(input_dim: int) -> torch.nn.Module``; the module
    maps ``Tensor[B, input_dim]`` to logits ``Tensor[B]`` for the positive (in-band) class.

    Probe sweeps name architectures in ``probe.architectures``.
    """


@hookspec
def register_reward_rules(register):
    """Contribute reward rules: how validity and scorer outputs combine into the RL reward.

    ``register(name: str, factory)`` where ``factory(config: propel_core.config.RewardConfig)``
    returns a callable ``rule(task: Task, scores: Mapping[str, float]) -> float``. ``scores`` holds the
    probe outputs the core computed for that task: ``logit`` and ``probability`` of the main probe,
    ``ensemble_logits`` for an ensemble. The rule returns one finite float; non-finite scores are an
    error, never a silent reward.

    A rule may carry a ``needs`` attribute, the set of score names it reads: the scorer then computes
    only those: probe scores, ``solver_utility`` (the real utility from K live solver attempts, for
    the solver-in-the-loop baseline), ``markers`` (workflow markers the generation reached) and
    ``verifier_score`` (the domain's own score of a valid task). Without it the rule gets the probe
    scores.

    The run uses the single rule named by ``reward.rule``.
    """


@hookspec
def register_context_samplers(register):
    """Contribute context samplers: which contexts the generator sees next.

    ``register(name: str, factory)`` where
    ``factory(contexts: list[Context], seed: int, **options) -> sampler``. The sampler provides
    ``sample(n: int) -> list[Context]`` and ``update(contexts: list[Context], rewards: list[float])``,
    which the core calls with the rewards those contexts earned (a no-op for samplers that ignore
    feedback). ``options`` is ``generate.sampler_options``.

    The run uses the sampler named by ``generate.context_sampler``.
    """


@hookspec
def register_sandboxes(register):
    """Contribute sandboxes that run untrusted code (everything a model writes) and test suites.

    ``register(name: str, factory)`` where ``factory(**options)`` returns a sandbox with
    ``run_python(files: dict[str, str], main: str, hash_seed: int = 0, time_limit=None)``: it writes
    ``files`` into a fresh workdir, runs ``main`` with Python under time, memory, process and output
    limits, and returns a result with a ``status`` (ok, error, timeout, oom, output_limit, crashed,
    no_result, sandbox_error) and ``result``, the JSON the program wrote to ``result.json``, parsed as
    data. A sandbox fails closed: a missing isolation layer is an error unless the options explicitly
    allow running without it.

    A sandbox that runs whole repositories (the SWE domain) also provides ``workspace(path=None,
    image=None, workdir="/testbed")``: a fresh copy of a checkout with ``run(command, time_limit)``,
    ``read(path)``, ``write(path, data)`` and ``close()``, removed with everything in it on close.

    Domains that execute code name the sandbox they use in their options and get it from
    ``domain.registry``.
    """


@hookspec
def register_commands(cli):
    """Add commands to the ``propel`` command line.

    ``cli`` is the top-level :class:`click.Group`; add a command or a group of commands to it
    (``@cli.group()`` for a family, such as the SWE domain's ``propel swe preflight``). Called once,
    when the command line starts, so import heavy libraries inside the commands, not here. A command
    that turns a bad input into :class:`propel_core.errors.PropelError` gets the same one-line error
    and exit status 1 as the core's own verbs.
    """


@hookspec
def register_executors(register):
    """Contribute executors: where solver attempts and generator episodes run.

    ``register(name: str, factory)`` where ``factory(workers: int, **options)`` returns an object
    implementing :class:`propel_core.execution.Executor`: ``run(worker, jobs)`` runs every job with
    ``worker.run(job)`` (a solver attempt, graded, or a generator episode, checked) and yields
    ``(job, result)`` as each one finishes, in any order; ``in_flight`` counts the jobs running now.
    ``workers`` is how many jobs may be in flight at once and ``options`` is ``executor.options``.

    A ``Worker`` pickles to its configuration, so an executor may ship it to other processes or
    machines, where it builds its own domain and backend. The caller is the only writer of run files
    and every job carries its own seed: an executor must not change what a job computes, only where
    and when it runs. Leaving the iterator early (an error, Ctrl-C) must stop the remaining jobs.

    Label, evaluate, generate, the solver-in-the-loop reward, solve-train's held-out evaluation and
    self-train all use the one executor named by ``executor.name``.
    """
