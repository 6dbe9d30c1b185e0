"""Every hook a propel plugin can implement, with what each component must be: the reference for
plugin authors. ``docs/plugin_hooks.md`` is generated from the docstrings of
[propel_core/hookspecs.py](../propel_core/hookspecs.py): edit them there, then run
``.venv/bin/python scripts/hook_docs.py``.

A plugin is a Python module (or any object) with functions marked ``@hookimpl``, found through the
``propel`` entry-point group; [docs/writing_plugins.md](writing_plugins.md) builds one as a package.
The built-ins (``propel_plugins.*``) are ordinary plugins, registered the same way.

```python
from propel_core import hookimpl
```

**Contribution hooks.** Every hook but ``register_commands`` has one shape: the core calls
``register_<kinds>(register)`` once per plugin while it builds the component registry (the first time
a stage or ``propel plugins`` needs it), and the plugin calls ``register(name, component)`` once for
each component it contributes. The core owns the names: it records which plugin gave each component
(``propel plugins`` lists them), two components of one kind under one name is an error that names
both plugins, and asking for a name nobody registered is an error that lists the installed names.

Components are chosen by their registered name in config (``reward.rule: wco``). What ``component``
must be differs per kind and is given under each hook; in every case the core calls it, so it may be
a class, a function, or any callable. A factory that finds an option's value wrong may raise any
exception with a message that names the option (``ValueError("solver_shots must be >= 0")``): the
command then ends in one line naming the component, its plugin, the options given and that message
(the traceback goes to the debug log). A domain is made before its stage writes anything; a model
backend when its model is first needed. The typed contracts are ``propel_core.domain.Domain``,
``propel_core.backend.ModelBackend`` and, for context samplers, reward rules, sandboxes and executors,
the protocols in ``propel_core.contracts``.

**``register_commands`` is not a contribution hook.** It gets the ``propel`` command line's
``click.Group``, registers no component, and is called once when the command line starts, not when
the registry is built.

Every hook has one argument, and it will stay what it is. The core calls each implementation
itself, not through pluggy's hook call, and hands it that argument (``register``; ``cli`` for
``register_commands``, from ``propel_core.cli.add_plugin_commands``); pluggy refuses a plugin whose
implementation names an argument the hook lacks. An implementation that raises (but for a name
registered twice, the error above) leaves its plugin out, components and commands alike, and
``propel plugins`` lists it as broken, with the error; every other plugin loads.

Heavy libraries (torch, transformers, trl) must be imported inside the component, never at module
import time: ``propel plugins`` imports every plugin and must answer in well under a second.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("propel")


@hookspec
def register_domains(register):
    """Contribute task domains.

    ``register(name: str, factory)`` where ``factory(**options) -> propel_core.domain.Domain``; the
    options are the config's ``domain.options``, checked against the factory's parameters (names,
    required ones, annotated types) when the config is read, as every component's options are. The
    core instantiates exactly one domain per run, the one named by ``domain.name``, and fills in its
    ``name`` and ``registry`` (a domain that runs code sets ``self.sandbox_name`` and
    ``self.sandbox_options`` and gets that sandbox from the registry as ``self.sandbox``; an option
    that holds the sandbox's options is declared in ``component_options``, so those are checked
    against the sandbox too).

    Subclass ``propel_core.domain.Domain`` and implement:

    - ``contexts()``: everything the generator may be conditioned on, each ``Context`` with a stable id;
    - ``generator_prompt(context)``: chat messages asking the generator for one task;
    - ``parse(generation)``: the task payload; raise ``ParseError(reason)`` when the generation is not
      a task;
    - ``render(payload)``: the text the frozen reference model reads (a list of turns for a
      multi-turn trajectory);
    - ``solver_prompt(payload)``: chat messages asking the solver to solve the task;
    - ``grade(payload, attempt)``: a ``Verdict``: solved, not solved, or ungradable (``solved=None``).

    A final assistant message in ``generator_prompt`` or ``solver_prompt`` is a prefill: the model
    continues it, and the text parsed or graded starts with it.

    **Many threads at once.** The executor runs jobs concurrently on the one domain object of a
    process: ``parse``, ``render``, the validity predicates, ``grade``, ``episode`` and
    ``solver_episode`` are called from many threads at the same time (``executor.workers`` of them on
    the ``local`` executor). Whatever a domain keeps between calls (a helper process, a cache, a
    connection, a counter) must be safe to share, or held per thread or per call; a verdict must
    not depend on what else is being graded. ``propel_core.testing.assert_same_verdicts_concurrently``
    grades attempts serially and from many threads and fails where a verdict changed: run it on
    your domain. Everything a model writes is hostile; a payload must be plain JSON data, which the
    core checks (``records.check_value``) before storing a task.

    Optional, each with a default:

    - ``validity_predicates`` (class attribute): names of registered validity predicates, run in order
      after parsing;
    - ``topic(payload)``: a coarse topic, for the top-topic diversity metric;
    - ``workflow_markers`` (class attribute) and ``markers_reached(generation)``: which markers a
      generation reached, for partial-credit rewards;
    - ``verifier_score(payload)``: a valid task's own score, where the domain has one;
    - a solver domain with partial credit (mle) puts ``markers`` and ``verifier_score`` in each
      ``Verdict``'s diagnostics, and ``looks_valid(payload, attempt)`` says which attempts look
      gradable without grading them (RM-GRPO scores only those with the reward model);
    - ``multi_turn = True`` with ``episode(context, reply, seed)`` and
      ``solver_episode(payload, reply)``: an agent domain whose generator and solver act over many
      turns, each answered by ``reply(messages)``; the episode returns the whole trajectory as text,
      which ``parse`` (or ``grade``) reads back;
    - ``uses_generator_model`` (default ``True``): a domain whose generator is a program, not the
      generator model (the swe domain's ``generator: procedural``), says ``False``; the core then never
      loads the generator model for its generations (generate, evaluate: no weights read, no backend
      built, and a reply asked for anyway is an error) and ``train`` refuses, there being no model to
      train;
    - ``stop_strings`` (class attribute, default none): strings that end a single-turn generation
      where the generator first writes one (``("\\n",)`` for a one-line task), added to
      ``generator.sampling.stop``; every backend and ``train``'s generation stop there and leave the
      string out. A generation the length limit cuts off first is an invalid task everywhere;
    - ``episode_contexts(contexts, seed)``: the contexts a run's generations get (generation ``i`` the
      ``i``-th), from those drawn for them and the run's seed, made once by the driver before any
      generation runs; by default the drawn ones. A domain that deals something out without
      replacement numbers each context's generations here (the swe procedural generator gives a
      repository's ``i``-th episode its ``i``-th distinct mutant), so what a generation gets does not
      depend on which worker runs it or when.

    ```python
    from propel_core.domain import Domain, ParseError, Verdict


    class ReverseWord(Domain):
        validity_predicates = ("word_length",)
        ...  # contexts, generator_prompt, parse, render, solver_prompt, grade


    @hookimpl
    def register_domains(register):
        register("reverse_word", ReverseWord)
    ```

    This repository's domain packages (one each under ``domains/``) register ``arithmetic``,
    ``countdown``, ``azr``, ``math`` ([docs/domains.md](domains.md)) and ``swe`` ([docs/swe.md](swe.md)).
    """


@hookspec
def register_validity_predicates(register):
    """Contribute validity predicates W(x): cheap checks that a task is usable at all.

    ``register(name: str, predicate)`` where
    ``predicate(task: propel_core.records.Task, domain: Domain) -> propel_core.records.Validity``.
    The task arrives parsed (``task.payload`` is set). A predicate never raises on bad input: it
    returns ``Validity.reject(reason)`` with a reason a person can act on. A predicate that computes
    facts later stages need (the AZR predicate runs f and keeps its outputs) records them in
    ``task.payload``.

    A domain lists the predicate names it applies in ``Domain.validity_predicates``; the core runs
    them in that order after parsing and stops at the first rejection, recorded on the task as
    ``"<predicate name>: <reason>"``. Predicates are registered globally, so one domain can reuse
    another's.

    ```python
    from propel_core.records import Validity


    @hookimpl
    def register_validity_predicates(register):
        def word_length(task, domain):
            n = len(task.payload["word"])
            return Validity.ok() if 5 <= n <= 12 else Validity.reject(f"{n} letters, outside 5..12")

        register("word_length", word_length)
    ```
    """


@hookspec
def register_model_backends(register):
    """Contribute model backends.

    ``register(name: str, factory)`` where ``factory(model: propel_core.config.ModelConfig, **options)``
    (``options``: the role's ``options``, checked against the factory's signature when the config is
    read) returns a ``propel_core.backend.ModelBackend``: a ``model_id``,
    ``generate(prompts, sampling, n=1, seed=None) -> list[list[str]]`` (``n`` completions per prompt
    in one batched call, with the caller's sampling knobs, each ending before the first of
    ``sampling.stop`` it writes; one the ``max_new_tokens`` limit ended is returned as
    ``propel_core.backend.Completion(text, cut_off=True)``, which generate records as an invalid
    task, and plain strings count as finished) and
    ``hidden_states(texts, layers, max_length) -> HiddenStates`` (hidden states at chosen layers).

    Each model role in config (``generator``, ``reference``, ``solver``) names its backend. The core
    creates one instance per model on first use (``Registry.backend``) and hands the same one to every
    role and component that names that model, which is why sampling is an argument of each call
    rather than part of the instance.

    ```python
    @hookimpl
    def register_model_backends(register):
        register("my_server", MyServerBackend)  # MyServerBackend(model_config)
    ```

    Built in: ``transformers`` (in-process Hugging Face models, the embedded default included),
    ``openai`` (any OpenAI-compatible endpoint) and ``vllm`` (vLLM's offline engine: its CPU build
    comes with ``scripts/setup.sh``; ``pip install 'propel-core[vllm]'`` on a CUDA machine; its
    engine settings are the role's ``options``, docs/scaling.md). The last two return text only, so the
    reference model keeps ``transformers``. ``propel-arithmetic`` adds ``arithmetic_skill``, a
    simulated solver whose chance of answering is a known function of the task.
    """


@hookspec
def register_poolers(register):
    """Contribute poolers that turn one task's hidden states into one vector.

    ``register(name: str, pooler)`` where
    ``pooler(hidden: Tensor[B, T, D], mask: Tensor[B, T]) -> Tensor[B, D']``. ``mask`` is 1 on real
    tokens and 0 on padding, which may sit on either side; padding must never reach the result.

    Probe sweeps name poolers in ``probe.poolings`` (each name becomes one column of the sweep) and
    ``probe.turn_vector`` (one vector per turn of a multi-turn task).

    ```python
    @hookimpl
    def register_poolers(register):
        register("sum", lambda hidden, mask: (hidden * mask.unsqueeze(-1)).sum(1))
    ```

    Built in: ``last_token``, ``mean_full``, ``mean_last_50``, ``mean_last_5``, ``mean_last_3``,
    ``mean_last_half``, ``max``, ``first_last_concat``, ``mean_std_concat``.
    """


@hookspec
def register_probe_architectures(register):
    """Contribute probe heads that map a pooled vector to a logit.

    ``register(name: str, factory)`` where ``factory(input_dim: int) -> torch.nn.Module``; the module
    maps ``Tensor[B, input_dim]`` to logits ``Tensor[B]`` for the positive (in-band) class. Probe
    sweeps name architectures in ``probe.architectures``.

    ```python
    @hookimpl
    def register_probe_architectures(register):
        def wide(input_dim):
            from torch import nn

            return nn.Sequential(nn.Linear(input_dim, 2048), nn.ReLU(), nn.Linear(2048, 1), nn.Flatten(0))

        register("wide", wide)
    ```

    The sweep trains heads as stacks: every head that is a ``Sequential`` starting with a ``Linear``,
    going on with ``Linear``, elementwise activations and ``Dropout``, and ending in ``Linear(., 1)``
    and ``Flatten(0)`` (as the example above) trains with the others of its layout in one batched
    pass, and gets the weights it would get alone. A head of any other shape trains alone. A factory
    may instead carry a ``fit(head, features, labels, train_rows, pos_weight) -> int`` attribute that
    fits the head on the standardized features itself and returns its number of iterations.

    Built in: ``linear``, ``mlp`` (d→512→128, dropout 0.3), ``deep_mlp`` (d→1024→512→256→128) and
    ``logistic``: a linear head whose weights scikit-learn's ``LogisticRegression`` (C=1, lbfgs) fits
    through ``fit`` instead of AdamW (install the ``sklearn`` extra to fit it; scoring needs torch only).
    """


@hookspec
def register_reward_rules(register):
    """Contribute reward rules: how validity and scores combine into the RL reward.

    ``register(name: str, factory)`` where ``factory(config: propel_core.config.RewardConfig,
    **options)`` returns a ``propel_core.contracts.RewardRule`` (``options``: the rule's entry of
    ``reward.options``, checked against the factory's signature when the config is read):
    ``rule(task: Task, scores: Mapping[str, Any]) -> float``. The rule returns one finite float; a
    missing or non-finite score is an error (``propel_core.errors.RewardError``), never a silent
    reward. A completion cut off at the length limit gets ``reward.overflow_reward`` without asking
    the rule.

    ``scores`` holds what the core computed for that task. Probe scores, for every task that parsed
    (valid or not): ``logit`` and ``probability`` of the main probe, ``ensemble_logits`` (one logit per
    probe bundle: the main one, then ``reward.probes``) and ``auxiliary_logit`` (the logit of the first
    of ``reward.probes``, when there is one: co-evolution's auxiliary probe). A task that did not parse
    has no probe scores.

    A rule may carry a ``needs`` attribute, the set of score names it reads; the scorer then computes
    only those: the probe scores above, ``solver_utility`` (the real utility from ``label.k`` live
    solver attempts at each valid task, as the label stage grades them), ``markers`` (how many of the
    domain's workflow markers the generation reached) and ``verifier_score`` (the domain's own score
    of a valid task). A rule without ``needs`` gets the probe scores.

    ``config.r_bad`` and ``config.overflow_reward`` are settled before the factory is called: where the
    config leaves them null, a rule whose ``needs`` holds a logit (``logit``, ``ensemble_logits``,
    ``auxiliary_logit``; or no ``needs`` at all) gets values below the lowest logit its probes give a
    valid labeled task, any other rule the paper's -0.2 and 0.0 (``RewardConfig.settled``).

    ```python
    @hookimpl
    def register_reward_rules(register):
        register("valid_only", lambda config: lambda task, scores: 1.0 if task.validity.valid else config.r_bad)
    ```

    ``train`` rewards every completion with the one rule named by ``reward.rule`` (``coevolve`` with
    the rule named by ``coevolve.mode``), and the ``probe`` stage calls it on the base policy's tasks
    to measure each cell's reward variance (RVP), with every probe score taken from that cell's one
    probe (a rule that raises ``RewardError`` there leaves that task out).

    Built in: ``hard``, ``soft``, ``probe_only``, ``wco``, ``adversarial``, ``solver_in_the_loop``
    (the paper's SIL baseline: ``needs = {"solver_utility"}``) and ``partial_instrumentation``
    (the ML-engineering RL study: ``needs = {"markers", valid_score}``, its options ``partial_base``,
    ``partial_step`` and ``valid_score``); see [docs/config.md](config.md).
    """


@hookspec
def register_context_samplers(register):
    """Contribute context samplers: which contexts the generator sees next.

    ``register(name: str, factory)`` where
    ``factory(contexts: list[Context], seed: int, **options)`` returns a
    ``propel_core.contracts.ContextSampler``: ``sample(n: int) -> list[Context]`` and
    ``update(contexts: list[Context], rewards: list[float])``, which the core calls with the rewards
    those contexts earned (a no-op for samplers that ignore feedback).

    ``generate`` and ``evaluate`` draw a run's contexts up front, in one ``sample(n)`` call, from the
    sampler named by ``generate.context_sampler`` with ``generate.sampler_options``. During
    ``propel train`` a fresh sampler of that name draws each prompt's context when the trainer asks
    for the next batch, and ``update`` follows every reward call with each completion's context and
    reward, so a sampler that learns shapes the next batch. ``solve-train`` samples its training
    tasks the same way (``solve_train.context_sampler``; each task a context, bucketed by its topic)
    with the verifier's rewards. A sampler may also offer ``diagnostics() -> dict``, logged after
    every update: with each step of ``train/reward_log.jsonl`` and ``solve/NAME/reward_log.jsonl``
    (key ``sampler``).

    A sampler may return a context with a ``trace`` (text: how the solver did on recently attempted
    tasks, one a line): the core shows it to the generator at the end of the last user message of
    the domain's ``generator_prompt``, after a fixed line (``propel_core.worker.TRACE_PREAMBLE``), in
    every generation and training prompt, so no domain reads it itself; in a multi-turn episode it
    stays in that message every turn. Everything else of the context is the domain's to read.

    ```python
    @hookimpl
    def register_context_samplers(register):
        register("first_only", FirstOnly)  # FirstOnly(contexts, seed)
    ```

    Built in: ``uniform``, ``progress`` (the progress-aware sampling study) and ``trace`` (either of
    them, each context with a trace of the last round's labeled tasks); see [docs/config.md](config.md).
    """


@hookspec
def register_sandboxes(register):
    """Contribute sandboxes that run untrusted code (everything a model writes) and test suites.

    ``register(name: str, factory)`` where ``factory(**options)`` returns a
    ``propel_core.contracts.Sandbox``:
    ``run_python(files: dict[str, str], main: str, hash_seed: int = 0, time_limit=None)`` writes
    ``files`` into a fresh workdir, runs ``main`` with Python under time, memory, process and output
    limits, and returns a result with a ``status`` (``ok``, ``error``, ``timeout``, ``oom``,
    ``output_limit``, ``disk_limit``, ``crashed``, ``no_result``, ``sandbox_error``) and ``result``,
    the JSON the program wrote to ``result.json``, parsed as data. A sandbox fails closed: a missing
    isolation layer is an error unless the options explicitly allow running without it
    (``allow_unisolated: true``).

    A sandbox that runs whole repositories (the SWE domain) also provides
    ``workspace(path=None, image=None, workdir="/testbed")``: a fresh copy of a checkout (from a local
    path, or an image), a ``propel_core.contracts.Workspace`` with ``run(command, time_limit)``,
    ``read(path)``, ``write(path, data)`` and ``close()``, which removes it with everything in it.

    Domains that execute code name the sandbox they use in their options, set ``self.sandbox_name`` and
    ``self.sandbox_options`` from them, and use ``self.sandbox`` (``Domain.sandbox``: made from the
    registry on first use, once; ``sandbox_runs = "repositories"`` for one with ``workspace``).

    ```python
    @hookimpl
    def register_sandboxes(register):
        register("firecracker", FirecrackerSandbox)  # FirecrackerSandbox(**options)
    ```

    Built in: ``local`` (bubblewrap namespaces, an unprivileged uid, resource limits; see
    [docs/sandbox.md](sandbox.md)); ``propel-swe`` adds ``docker`` (see [docs/swe.md](swe.md)).
    """


@hookspec
def register_commands(cli):
    """Add commands to the ``propel`` command line. Not a contribution hook: no ``register`` callback.

    ``cli`` is the top-level ``click.Group``; add a command or a group of commands to it
    (``@cli.group()`` for a family, such as the SWE domain's ``propel swe preflight``). The hook
    registers no component and is called once, when the command line starts (not when the registry
    is built), so import heavy libraries inside the commands, not here. A command that turns a bad
    input into ``propel_core.errors.PropelError`` gets the same one-line error and exit status 1 as
    the core's own verbs.

    ```python
    @hookimpl
    def register_commands(cli):
        @cli.group()
        def swe():
            \"\"\"Repository tools of the SWE domain.\"\"\"
    ```
    """


@hookspec
def register_executors(register):
    """Contribute executors: where solver attempts and generator episodes run.

    ``register(name: str, factory)`` where ``factory(workers: int, **options)`` returns a
    ``propel_core.contracts.Executor``: ``run(worker, jobs)`` runs every job with ``worker.run(job)``
    and yields ``(job, result)`` as each one finishes, in any order; ``in_flight`` counts the jobs
    running now. A job is one solver attempt (the result is a graded ``SolverAttempt``) or one
    generator episode (the result is a checked ``Task``). ``workers`` is how many jobs may be in
    flight at once and ``options`` is ``executor.options``.

    A ``Worker`` pickles to its configuration (domain, model, sampling), so an executor may ship it to
    other processes or machines, where it builds its own domain and backend. The caller is the only
    writer of run files and every job carries its own seed: an executor must not change what a job
    computes, only where and when it runs. Leaving the iterator early (an error, Ctrl-C) must stop the
    jobs still running or queued.

    ```python
    @hookimpl
    def register_executors(register):
        register("slurm", SlurmExecutor)  # SlurmExecutor(workers, **options)
    ```

    Label, evaluate, generate, the solver-in-the-loop reward, solve-train's held-out evaluation and
    self-train all use the one executor named by ``executor.name``. Built in: ``local`` (threads on
    this machine; the model turns of concurrent jobs go to an in-process model as one batched call)
    and ``ray`` (Ray tasks on a cluster); see [docs/scaling.md](scaling.md).
    """
