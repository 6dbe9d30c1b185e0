"""The ``mle`` domain (the ML-engineering RL study's machine-learning engineering setting), registered with propel.

A task is a data set, the column to predict, a metric and a bar (the score a solution must reach).
As a solver domain, an attempt is a Python script; it runs in the sandbox on the task's public
files, and its verdict carries the workflow markers it reached, its held-out verifier score and its
duration (``solve-train`` turns them into the ML-engineering RL study's partial-instrumentation reward). As a
generator domain, the generator writes a task, and two validity predicates check that it is well
formed and that a reference solution reaches its bar.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, ClassVar

from propel_core import (
    Context,
    Domain,
    Messages,
    ParseError,
    PropelError,
    Task,
    Validity,
    Verdict,
    cache_dir,
    hookimpl,
    make_task,
)
from propel_mle.datasets import CATALOG, METRICS, data_set, public_files, split, stored_secret
from propel_mle.environment import MARKERS, SUBMISSION, Rollout, execute

#: the tasks shipped for the solver direction (``propel mle tasks``); each bar sits below what the
#: reference solution reaches with any secret (docs/mle.md: its lowest over ten secrets)
TASKS = (
    {"dataset": "iris", "target": "target", "metric": "accuracy", "bar": 0.8},
    {"dataset": "wine", "target": "target", "metric": "f1", "bar": 0.9},
    {"dataset": "breast_cancer", "target": "target", "metric": "auc", "bar": 0.95},
    {"dataset": "digits", "target": "target", "metric": "accuracy", "bar": 0.9},
    {"dataset": "diabetes", "target": "target", "metric": "rmse", "bar": 0.15},
    {"dataset": "synthetic_classes", "target": "target", "metric": "accuracy", "bar": 0.75},
    {"dataset": "synthetic_regression", "target": "target", "metric": "rmse", "bar": 0.45},
    {"dataset": "breast_cancer", "target": "target", "metric": "f1", "bar": 0.9},
)
FIELDS = {"dataset": "Data set", "target": "Target", "metric": "Metric", "bar": "Bar"}
LINES = {
    key: re.compile(rf"^\s*{label}\s*[:=][ \t]*(\S[^\n]*)", re.IGNORECASE | re.MULTILINE)
    for key, label in FIELDS.items()
}
CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@hookimpl
def register_domains(register):
    register("mle", MLE)


@hookimpl
def register_commands(cli):
    import click

    @cli.group()
    def mle():
        """Tools of the MLE domain (docs/mle.md)."""

    def _mle_run(ctx, config: str, overrides: tuple[str, ...], verb: str):
        """The run of ``propel mle VERB CONFIG overrides`` and its domain, refused unless it is this one."""
        from propel_core import start

        run = start(ctx, [config], overrides)
        if run.config.domain.name != "mle":
            raise PropelError(f"propel mle {verb} needs domain.name: mle, not {run.config.domain.name!r}")
        return run, run.domain()

    @mle.command(context_settings={"ignore_unknown_options": True})
    @click.argument("config", type=click.Path(exists=True, dir_okay=False))
    @click.argument("overrides", nargs=-1)
    @click.pass_context
    def tasks(ctx: click.Context, config: str, overrides: tuple[str, ...]) -> None:
        """Write the shipped tasks, checked like generated ones (the reference solution runs on each),
        to RUN/mle/tasks.jsonl: what solve-train trains and evaluates the solver on."""
        from propel_core import JsonlWriter

        run, domain = _mle_run(ctx, config, overrides, "tasks")
        path = run.dir / "mle" / "tasks.jsonl"
        path.unlink(missing_ok=True)
        with JsonlWriter(path) as out, run.progress("reference solutions", total=len(TASKS)) as advance:
            for i, payload in enumerate(TASKS):
                task = shipped_task(domain, i)
                out.write(task)
                reference = domain.reference(task.payload)
                score = "none" if reference.verifier_score is None else f"{reference.verifier_score:.4f}"
                verdict = "valid" if task.validity.valid else json.dumps(task.validity.reason)
                run.say(
                    f"{task.id}  {domain.topic(payload):28s} bar {payload['bar']:<5} reference {score}  "
                    f"{reference.duration:.1f} s  {verdict}"
                )
                advance(1)
        run.say(f"wrote {path}")

    @mle.command(context_settings={"ignore_unknown_options": True})
    @click.argument("config", type=click.Path(exists=True, dir_okay=False))
    @click.argument("overrides", nargs=-1)
    @click.option(
        "--tasks", "count", type=click.IntRange(1, len(TASKS)), default=len(TASKS), help="The first N shipped tasks."
    )
    @click.pass_context
    def corpus(ctx: click.Context, config: str, overrides: tuple[str, ...], count: int) -> None:
        """Run every script of MODELS on every shipped task and write them, verified, as a labeled corpus
        to RUN/mle/corpus/ (tasks.jsonl, labels.jsonl): the ML-engineering RL study's offline scored solutions, which
        `propel rank rank.items=attempts rank.labels=mle/corpus/labels.jsonl` trains a reward model on."""
        from propel_core import Label, encode, graded_texts

        run, domain = _mle_run(ctx, config, overrides, "corpus")
        tasks = [shipped_task(domain, i) for i in range(count)]
        scripts = [(task, f"```python\n{solution(task.payload, model)}```") for task in tasks for model in MODELS]
        graded = graded_texts(run.services, scripts, run.config.solver)
        folder = run.dir / "mle" / "corpus"
        folder.mkdir(parents=True, exist_ok=True)
        band = (run.config.label.band_low, run.config.label.band_high)
        (folder / "tasks.jsonl").write_bytes(b"".join(encode(task) + b"\n" for task in tasks))
        with (folder / "labels.jsonl").open("wb") as out:
            for i, task in enumerate(tasks):
                attempts = graded[i * len(MODELS) : (i + 1) * len(MODELS)]
                out.write(encode(Label.from_attempts(task.id, attempts, band, 1)) + b"\n")
                scores = [attempt.diagnostics.get("verifier_score") for attempt in attempts]
                shown = ", ".join(
                    f"{m} {'none' if v is None else round(v, 3)}" for m, v in zip(MODELS, scores, strict=True)
                )
                run.say(f"{task.id}  {domain.topic(task.payload):28s} {shown}")
        run.say(f"wrote {folder}")


def shipped_task(domain: MLE, i: int) -> Task:
    """Shipped task ``i`` as a task record, checked as a generated one is (the reference runs once)."""
    predicates = domain.registry.validity_predicates(domain)
    context = domain.contexts()[i % len(domain.contexts())]
    return make_task(f"mle-{i:03d}", domain, context, domain.render(TASKS[i]), "shipped", predicates)


@hookimpl
def register_validity_predicates(register):
    register("mle_well_formed", check_well_formed)
    register("mle_achievable", check_achievable)


class MLE(Domain):
    """Small tabular ML problems, solved by Python scripts run in the sandbox (docs/mle.md).

    Options: ``sandbox`` (``local`` or ``docker``) and its ``sandbox_options``; ``python_env``, the
    environment solutions run with (numpy, pandas, scikit-learn; default: this one; for docker, where
    the image has it), whose bundled data sets and test data are hidden from them; ``secret``, what
    splits and generated data sets are drawn with (default: one made once in the cache folder; give
    every machine of a cluster the same); ``time_limit`` seconds per rollout; ``max_code_chars``;
    ``num_contexts`` and ``seed`` for the generator's contexts.
    """

    validity_predicates = ("mle_well_formed", "mle_achievable")
    sandbox_runs = "repositories"
    component_options: ClassVar[dict[str, tuple[str, str]]] = {"sandbox_options": ("sandboxes", "sandbox")}
    #: reached by solutions, not by task texts: the grader's verdict lists them (``diagnostics["markers"]``)
    workflow_markers = MARKERS

    def __init__(
        self,
        sandbox: str = "local",
        sandbox_options: dict[str, Any] | None = None,
        python_env: str | None = None,
        secret: str | None = None,
        time_limit: float = 60.0,
        max_code_chars: int = 20_000,
        num_contexts: int = 14,
        seed: int = 1234,
    ):
        self.sandbox_name, self.time_limit, self.max_code_chars = sandbox, time_limit, max_code_chars
        options = dict(sandbox_options or {})
        environment = Path(python_env or options.get("python_env") or sys.prefix)
        defaults: dict[str, Any] = {"time_limit": time_limit}
        if sandbox == "local":
            defaults |= {"memory_mb": 2048, "python_env": str(environment)}
        if sandbox in ("local", "docker") and "hide" not in options:  # both run solutions with that environment
            defaults["hide"] = hidden_folders(environment)
        self.sandbox_options = {**defaults, **options}
        self.secret = secret or stored_secret(cache_dir() / "mle")
        self._files = tempfile.TemporaryDirectory(prefix="propel-mle-")
        self._references: dict[tuple[str, str, str], Rollout] = {}
        self._lock, self._reference_lock = threading.Lock(), threading.Lock()
        self._contexts = _contexts(num_contexts, seed)

    # -- the generator's side ----------------------------------------------------------------------

    def contexts(self) -> list[Context]:
        return self._contexts

    def generator_prompt(self, context: Context) -> Messages:
        catalog = "\n".join(
            f"- {data.name}: {data.description}; metrics: {', '.join(data.metrics)}" for data in CATALOG.values()
        )
        examples = "\n\n".join(self.render(example) for example in context.data["examples"])
        return [
            {
                "role": "user",
                "content": (
                    "You write machine-learning tasks. A task names a data set, the column to predict "
                    "(the target; for a regression data set any column), a metric, and the bar: the score a "
                    "solution must reach on held-out rows. Accuracy, F1 and AUC lie in [0, 1]; RMSE is "
                    "scored as 1 - RMSE / (standard deviation of the target), at most 1.\n\n"
                    f"Data sets:\n{catalog}\n\nTwo example tasks:\n\n{examples}\n\n"
                    f"Write one new task on the data set {context.data['dataset']} in exactly this format and "
                    "nothing else:\nData set: <name>\nTarget: <column>\nMetric: <metric>\nBar: <number>"
                ),
            },
            {"role": "assistant", "content": "Data set:"},
        ]

    def parse(self, generation: str) -> dict[str, Any]:
        found = {}
        for key, line in LINES.items():
            match = line.search(generation)
            if match is None:
                raise ParseError(f"no '{FIELDS[key]}:' line")
            found[key] = match.group(1).strip().strip("`'\"")
        try:
            found["bar"] = float(found["bar"])
        except ValueError:
            raise ParseError(f"the bar {found['bar'][:40]!r} is not a number") from None
        found["metric"] = found["metric"].lower()
        return found

    def render(self, payload: dict[str, Any]) -> str:
        return "\n".join(f"{label}: {payload[key]}" for key, label in FIELDS.items())

    def topic(self, payload: dict[str, Any]) -> str:
        return f"{payload['dataset']} {payload['metric']}"

    # -- the solver's side -------------------------------------------------------------------------

    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        parts = split(payload["dataset"], payload["target"], self.secret)
        target, metric = payload["target"], payload["metric"]
        columns = _columns([c for c in parts.train.columns if c != target])
        if metric == "auc":
            answer = f"the probability that {target} is {max(parts.classes):g}"
        elif parts.classes is not None:
            answer = f"one of the classes {', '.join(f'{c:g}' for c in parts.classes)}"
        else:
            answer = "a number"
        return [
            {
                "role": "user",
                "content": (
                    f"Write a Python script that solves this machine-learning task. The current folder has "
                    f"train.csv ({len(parts.train)} rows; feature columns {columns}; and the column {target}) and "
                    f"test.csv ({len(parts.test)} rows; an id column and the same feature columns, without {target}). "
                    f"Train a model on train.csv, predict {target} for every row of test.csv, and write "
                    f"submission.csv with the header id,{target} and one row per test id giving {answer}. "
                    f"The submission is scored by {metric} on the held-out answers and must reach {payload['bar']}. "
                    "You can use numpy, pandas and scikit-learn; there is no network. Reply with the whole "
                    "script in one ```python block."
                ),
            },
            {"role": "assistant", "content": "```python\n"},
        ]

    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        """Run the script in ``attempt`` and score it; ``diagnostics``: the markers it reached, its
        ``verifier_score`` (None unless its submission is valid), the raw metric, its sandbox status
        and ``duration`` (seconds of execution and scoring)."""
        found = CODE.findall(attempt)
        if not found or not found[0].strip():
            return Verdict(False, "no ```python block", _diagnostics(Rollout(reason="no code")))
        code = found[0]
        if len(code) > self.max_code_chars:
            return Verdict(False, f"the script exceeds {self.max_code_chars} characters", _diagnostics(Rollout()))
        rollout = self.run(payload, code)
        if rollout.status == "sandbox_error":
            return Verdict(None, rollout.reason, _diagnostics(rollout))  # our failure, not the solver's
        if not rollout.valid:
            return Verdict(False, rollout.reason, _diagnostics(rollout))
        solved = rollout.verifier_score >= float(payload["bar"])
        reason = None if solved else f"{payload['metric']} score {rollout.verifier_score:.4f} is below the bar"
        return Verdict(solved, reason, _diagnostics(rollout))

    def looks_valid(self, payload: dict[str, Any], attempt: str) -> bool:
        """A script that parses as Python and names the submission file (RM-GRPO's cheap check)."""
        found = CODE.findall(attempt)
        if not found or len(found[0]) > self.max_code_chars or SUBMISSION not in found[0]:
            return False
        try:
            ast.parse(found[0])  # parsing only: nothing is compiled or run
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        return True

    def run(self, payload: dict[str, Any], code: str) -> Rollout:
        """One execution of ``code`` on the task ``payload``, scored against its held-out labels."""
        dataset, target, metric = payload["dataset"], payload["target"], payload["metric"]
        with self._lock:  # concurrent rollouts of a task write its files once
            folder = public_files(dataset, target, self.secret, Path(self._files.name) / f"{dataset}-{target}")
        parts = split(dataset, target, self.secret)
        return execute(self.sandbox, folder, code, parts, target, metric, self.time_limit)

    def reference(self, payload: dict[str, Any]) -> Rollout:
        """The reference solution's rollout on the task (once per data set, target and metric)."""
        key = (payload["dataset"], payload["target"], payload["metric"])
        with self._reference_lock:
            if key not in self._references:
                self._references[key] = self.run(payload, solution(payload))
            return self._references[key]


def _diagnostics(rollout: Rollout) -> dict[str, Any]:
    return {
        "markers": rollout.markers,
        "verifier_score": rollout.verifier_score,
        "metric_value": rollout.metric_value,
        "status": rollout.status,
        "duration": round(rollout.duration, 3),
    }


def _columns(names: list[str]) -> str:
    if len(names) <= 14:
        return ", ".join(names)
    return f"{', '.join(names[:4])}, ..., {', '.join(names[-2:])} ({len(names)} in all)"


#: the models of the scripts written here: the module, then the classifier and the regressor it makes
#: (one template for both where ``{}`` stands for Classifier or Regressor)
MODELS = {
    "forest": ("sklearn.ensemble", "RandomForest{}(n_estimators=200, random_state=0)"),
    "small forest": ("sklearn.ensemble", "RandomForest{}(n_estimators=5, max_depth=3, random_state=0)"),
    "linear": ("sklearn.linear_model", "LogisticRegression(max_iter=2000)", "Ridge()"),
    "neighbours": ("sklearn.neighbors", "KNeighbors{}(n_neighbors=15)"),
    "stump": ("sklearn.tree", "DecisionTree{}(max_depth=1)"),
    "baseline": ("sklearn.dummy", "Dummy{}()"),
}


def solution(payload: dict[str, Any], model: str = "forest") -> str:
    """A plain scikit-learn script for the task with one of ``MODELS``: ``forest`` is the reference
    solution the achievability check runs; all of them make the scored corpus (``propel mle corpus``)."""
    target, metric = payload["target"], payload["metric"]
    module, *made = MODELS[model]
    regression = data_set(payload["dataset"]).kind == "regression"
    made = made[regression] if len(made) == 2 else made[0].format("Regressor" if regression else "Classifier")
    predict = "model.predict_proba(test[features])[:, 1]" if metric == "auc" else "model.predict(test[features])"
    return (
        "import pandas as pd\n"
        f"from {module} import {made.split('(')[0]}\n\n"
        'train = pd.read_csv("train.csv")\n'
        'test = pd.read_csv("test.csv")\n'
        f'features = [c for c in train.columns if c != "{target}"]\n'
        f"model = {made}\n"
        f'model.fit(train[features], train["{target}"])\n'
        f'pd.DataFrame({{"id": test["id"], "{target}": {predict}}}).to_csv("submission.csv", index=False)\n'
    )


def check_well_formed(task: Task, domain: MLE) -> Validity:
    payload = task.payload
    if payload["dataset"] not in CATALOG:
        return Validity.reject(f"unknown data set {payload['dataset'][:40]!r}; one of {', '.join(CATALOG)}")
    data = data_set(payload["dataset"])
    if payload["target"] not in data.targets():
        shown = ", ".join(data.targets()[:8])
        return Validity.reject(f"{data.name} has no column {payload['target'][:40]!r} to predict (e.g. {shown})")
    if payload["metric"] not in data.metrics:
        return Validity.reject(f"{payload['metric'][:20]!r} does not fit {data.name}; one of {', '.join(data.metrics)}")
    low, high = METRICS[payload["metric"]]
    if not low <= payload["bar"] <= high:
        return Validity.reject(f"the bar {payload['bar']} lies outside the {payload['metric']} range [{low}, {high}]")
    return Validity.ok()


def check_achievable(task: Task, domain: MLE) -> Validity:
    """The reference solution, run like any solution, reaches the bar."""
    reference = domain.reference(task.payload)
    if reference.verifier_score is None:
        return Validity.reject(f"the reference solution gives no score: {reference.reason}")
    if reference.verifier_score < task.payload["bar"]:
        return Validity.reject(f"the reference solution scores {reference.verifier_score:.4f}, below the bar")
    return Validity.ok()


def hidden_folders(environment: Path) -> list[str]:
    """What a solution must not read although the sandbox shows it: in the python environment it runs
    with, the data sets scikit-learn ships and every test folder of every installed package (scipy's
    and scikit-learn's test data hold labelled copies of iris, for one); and the packages of the
    interpreter a virtual environment is made from and of the system's Pythons (under ``/usr``, which
    the sandbox shows), which the environment does not use. Refuses an
    environment where it finds no scikit-learn data: hiding nothing there would be failing open."""
    roots = _package_folders(environment)
    found = [root / "sklearn" / "datasets" / name for root in roots for name in ("data", "descr", "images")]
    found = [folder for folder in found if folder.is_dir()]
    if not found:
        raise PropelError(
            f"no scikit-learn data sets found in {environment} to hide from solutions: give the domain the "
            "python_env solutions run with, or list what to hide in sandbox_options.hide"
        )
    for root in roots:
        for parent, folders, _ in os.walk(root):
            found += [Path(parent) / name for name in folders if name in TEST_FOLDERS]
            folders[:] = [name for name in folders if name not in TEST_FOLDERS]
    base = Path(os.path.realpath(environment / "bin" / "python")).parent.parent
    settings = environment / "pyvenv.cfg"
    shared = settings.exists() and "include-system-site-packages = true" in settings.read_text()
    others = [*_package_folders(Path("/usr")), *_package_folders(Path("/usr/local"))]  # the system's Pythons
    if base != environment and not shared:
        others += _package_folders(base)
    found += [root for root in dict.fromkeys(others) if root not in roots]
    return [str(folder) for folder in found]


def _package_folders(prefix: Path) -> list[Path]:
    return [root for root in prefix.glob("lib/python3*/*-packages") if root.name in PACKAGE_FOLDERS]


PACKAGE_FOLDERS = ("site-packages", "dist-packages")
TEST_FOLDERS = frozenset({"tests", "test"})


def _contexts(count: int, seed: int) -> list[Context]:
    """One context per data set in turn, each showing two example tasks of the shipped kind."""
    rng = random.Random(seed)
    names = list(CATALOG)
    contexts = []
    for index in range(count):
        name = names[index % len(names)]
        examples = []
        for _ in range(2):
            data = data_set(rng.choice(names))
            metric = rng.choice(data.metrics)
            low, high = METRICS[metric]
            examples.append(
                {
                    "dataset": data.name,
                    "target": "target",
                    "metric": metric,
                    "bar": round(rng.uniform(low + 0.5 * (high - low), high * 0.95), 2),
                }
            )
        contexts.append(Context(id=f"mle-{index:03d}", data={"dataset": name, "examples": examples}, bucket=name))
    return contexts
