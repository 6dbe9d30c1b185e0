"""SWE solver attempts on a real two-node Ray cluster: the tiny repository's procedural bugs, solved
by the embedded model served over HTTP and graded in the local sandbox on whichever node ran them,
get the same labels as with the local executor."""

import json

import pytest
from swe_helpers import write_registry

from propel_core.execution import label_tasks, sample_tasks
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.run import Run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swe_run(tiny_repo, test_env, propel_loopback_server, tmp_path_factory):
    """``swe_run(executor)``: a run on the tiny repository with that executor, the solver served."""
    from conftest import SANDBOX, needs_local_sandbox

    needs_local_sandbox()
    folder = tmp_path_factory.mktemp("swe-ray")
    registry = write_registry(folder, [{"name": "tinystats", "path": str(tiny_repo), "time_budget": 60}])
    options = {
        "registry": str(registry),
        "preflight_dir": str(folder / "preflight"),
        "generator": "procedural",
        "solver_max_turns": 1,
        "solver_budget": 120,
        "sandbox_options": {**SANDBOX, "python_env": str(test_env)},
    }

    def make(executor: dict, name: str) -> Run:
        config = validate_config(
            {
                "run_dir": str(folder / name),
                "seed": 1,
                "domain": {"name": "swe", "options": options},
                "label": {"k": 2},
                "executor": executor,
                "solver": {
                    "backend": "openai",
                    "model": "smol",
                    "base_url": propel_loopback_server.url,
                    "sampling": {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 16},
                },
            }
        )
        return Run(config, Registry.build(), quiet=True)

    return make


def outcome(labels):
    """What a label says, less what the wall clock and the sandbox's process addresses put in a
    trajectory: each attempt's verdict, reason and the model's turns."""
    return [
        (
            label.task_id,
            label.solve_rate,
            [
                (attempt.solved, attempt.reason, [turn["assistant"] for turn in json.loads(attempt.text)["turns"]])
                for attempt in label.attempts
            ],
        )
        for label in labels
    ]


def test_ray_labels_of_swe_bugs_equal_local_labels(propel_ray_cluster, swe_run):
    local = swe_run({"name": "local", "workers": 4}, "local")
    contexts = local.domain().contexts() * 3
    written = sample_tasks(
        local.services, local.config.generator, contexts, local.dir / "tasks.jsonl", local.config.seed
    )
    tasks = [task for task in written if task.validity.valid][:2]
    assert len(tasks) == 2, "the procedural generator planted fewer than two valid bugs"
    plan = local.plans.label
    expected = sorted(
        label_tasks(local.services, tasks, local.dir / "labels.jsonl", plan), key=lambda label: label.task_id
    )
    ray = swe_run({"name": "ray", "workers": 4, "options": {"resources": {"sandbox": 1}}}, "ray")
    labels = sorted(label_tasks(ray.services, tasks, ray.dir / "labels.jsonl", plan), key=lambda label: label.task_id)
    assert outcome(labels) == outcome(expected)
    assert all(attempt.solved is not None for label in labels for attempt in label.attempts)  # all graded
