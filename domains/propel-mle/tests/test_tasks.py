"""The MLE domain as a generator domain: what a generated task must be, the achievability check by a
real sandboxed reference run, the shipped tasks, and K solver attempts giving a solve rate."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from propel_core.domain import ParseError, make_task
from propel_core.execution import label_tasks
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run
from propel_mle.datasets import CATALOG, split, stored_secret
from propel_mle.plugin import MODELS, TASKS


@pytest.fixture(scope="module")
def registry():
    return Registry.build()


@pytest.fixture(scope="module")
def mle(registry):
    return registry.domain("mle")


def task_of(mle, registry, generation):
    predicates = registry.validity_predicates(mle)
    return make_task("t0", mle, mle.contexts()[0], generation, "g", predicates)


def test_a_task_is_read_from_four_lines(mle):
    prompt = mle.generator_prompt(mle.contexts()[0])
    assert prompt[-1] == {"role": "assistant", "content": "Data set:"}  # the generator continues it
    payload = mle.parse("Data set: wine\nTarget: target\n Metric: F1\nBar: 0.85\nsome chatter")
    assert payload == {"dataset": "wine", "target": "target", "metric": "f1", "bar": 0.85}
    assert mle.parse(mle.render(payload)) == payload
    with pytest.raises(ParseError, match="no 'Bar:' line"):
        mle.parse("Data set: wine\nTarget: target\nMetric: f1")
    with pytest.raises(ParseError, match="is not a number"):
        mle.parse("Data set: wine\nTarget: target\nMetric: f1\nBar: high")


@pytest.mark.parametrize(
    "generation, reason",
    [
        ("Data set: titanic\nTarget: survived\nMetric: accuracy\nBar: 0.8", "unknown data set 'titanic'"),
        ("Data set: iris\nTarget: petal_width\nMetric: accuracy\nBar: 0.8", "no column 'petal_width'"),
        ("Data set: iris\nTarget: target\nMetric: auc\nBar: 0.8", "does not fit iris"),  # 3 classes
        ("Data set: diabetes\nTarget: target\nMetric: accuracy\nBar: 0.8", "does not fit diabetes"),
        ("Data set: wine\nTarget: target\nMetric: f1\nBar: 1.5", "outside the f1 range"),
    ],
)
def test_ill_formed_tasks_are_rejected_before_anything_runs(mle, registry, generation, reason):
    task = task_of(mle, registry, generation)
    assert not task.validity.valid and reason in task.validity.reason and task.validity.reason.startswith("mle_well")


def test_regression_sets_may_predict_any_column_and_each_split_hides_its_target():
    assert "bmi" in CATALOG["diabetes"].targets() and CATALOG["iris"].targets() == ("target",)
    parts = split("diabetes", "bmi", "s3cret")
    assert "bmi" in parts.train.columns and "bmi" not in parts.test.columns and "target" in parts.test.columns
    assert list(parts.test.columns[:1]) == ["id"] and len(set(parts.ids)) == len(parts.test)
    assert len(parts.labels) == len(parts.test) and parts.classes is None
    assert split("diabetes", "bmi", "s3cret").ids == parts.ids  # fixed: every rollout sees the same files
    assert split("diabetes", "bmi", "other").ids != parts.ids  # but not without the secret


def test_the_secret_is_made_once_and_kept_private(tmp_path):
    secret = stored_secret(tmp_path / "mle")
    assert len(secret) == 32 and stored_secret(tmp_path / "mle") == secret
    assert (tmp_path / "mle" / "secret").stat().st_mode & 0o077 == 0
    generated = CATALOG["synthetic_classes"]
    assert not generated.frame("a").equals(generated.frame("b"))  # a generated set is drawn with it too
    assert list(generated.frame("a").columns) == list(generated.frame("b").columns)


def test_an_environment_without_the_data_to_hide_is_refused(tmp_path):
    from propel_core.errors import PropelError
    from propel_mle.plugin import hidden_folders

    with pytest.raises(PropelError, match="no scikit-learn data sets found"):
        hidden_folders(tmp_path)
    found = hidden_folders(Path(sys.prefix))
    assert any(path.endswith("sklearn/datasets/data") for path in found)
    assert any(path.endswith("scipy/spatial/tests") for path in found)  # holds a copy of iris


@pytest.mark.slow
def test_achievability_runs_the_reference_solution(mle, registry):
    if not mle.sandbox.isolated:
        pytest.skip("the MLE environment runs solutions only with every isolation layer")
    reachable = task_of(mle, registry, "Data set: diabetes\nTarget: bmi\nMetric: rmse\nBar: 0.05")
    assert reachable.validity.valid, reachable.validity.reason
    too_high = task_of(mle, registry, "Data set: diabetes\nTarget: bmi\nMetric: rmse\nBar: 0.9")
    assert not too_high.validity.valid and "below the bar" in too_high.validity.reason
    assert len(mle._references) == 1  # one reference run answers every bar of the same task


@pytest.mark.slow
def test_the_shipped_tasks_all_pass_their_checks(tmp_path, propel_cli):
    config = tmp_path / "mle.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ndomain: {{name: mle}}\n")
    done = propel_cli("-q", "mle", "tasks", str(config))
    tasks = list(iter_jsonl(tmp_path / "run" / "mle" / "tasks.jsonl", Task))
    assert [task.payload for task in tasks] == list(TASKS), done.stdout
    assert all(task.validity.valid for task in tasks), [task.validity.reason for task in tasks]
    assert done.stdout.count("valid") == len(TASKS)


@pytest.mark.slow
def test_k_solver_attempts_give_a_solve_rate_and_a_utility(tmp_path, registry, mle):
    """The label stage's path with the embedded solver: K scripts per task, each really executed."""
    if not mle.sandbox.isolated:
        pytest.skip("the MLE environment runs solutions only with every isolation layer")
    data = {
        "run_dir": str(tmp_path),
        "domain": {"name": "mle"},
        "solver": {"sampling": {"max_new_tokens": 48}},
        "label": {"k": 2},
    }
    run = Run(validate_config(data, registry), registry, quiet=True)
    task = task_of(mle, registry, "Data set: iris\nTarget: target\nMetric: accuracy\nBar: 0.9")
    plan = replace(run.plans.label, seed=0)
    (label,) = label_tasks(run.services, [task], tmp_path / "labels.jsonl", plan)
    assert len(label.attempts) == 2 and label.solve_rate is not None and label.utility in (0, 1)
    for attempt in label.attempts:  # each attempt ran: its markers and duration are in its diagnostics
        assert attempt.text.startswith("```python\n") and attempt.diagnostics["duration"] >= 0
        assert set(attempt.diagnostics["markers"]) <= set(mle.workflow_markers)
    json.dumps([a.diagnostics for a in label.attempts])  # plain data, as labels.jsonl stores it


@pytest.mark.slow
def test_the_scored_corpus_orders_the_scripts_by_their_real_scores(tmp_path, propel_cli):
    """``propel mle corpus``: every script really runs; the 200-tree forest beats the prior-only
    baseline on iris, and the corpus is what ``rank.items=attempts`` reads."""
    config = tmp_path / "mle.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ndomain: {{name: mle}}\nexecutor: {{workers: 2}}\n")
    done = propel_cli("-q", "mle", "corpus", str(config), "--tasks", "1")
    folder = tmp_path / "run" / "mle" / "corpus"
    (label,) = list(iter_jsonl(folder / "labels.jsonl", Label))
    scores = {model: a.diagnostics["verifier_score"] for model, a in zip(MODELS, label.attempts, strict=True)}
    reference = Registry.build().domain("mle").reference(TASKS[0])  # the same secret: this machine's
    assert scores["forest"] == pytest.approx(reference.verifier_score) and scores["baseline"] < 0.5, done.stdout
    assert all(score is not None for score in scores.values())
    assert [task.id for task in iter_jsonl(folder / "tasks.jsonl", Task)] == [label.task_id]
    assert propel_cli("mle", "corpus", str(config), "--tasks", "99", check=False).returncode == 2
