"""The SWE domain through the propel command line on the tiny repository: preflight, generate
(procedural bugs), label (K=3 real solver episodes by the embedded model, graded on clean checkouts)
and extract (one activation per generated turn, pooled over the trajectory)."""

import json

import pytest
import yaml
from swe_helpers import write_registry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swe_config(tiny_repo, test_env, tmp_path_factory):
    folder = tmp_path_factory.mktemp("swe-run")
    registry = write_registry(folder, [{"name": "tinystats", "path": str(tiny_repo), "time_budget": 60}])
    config = {
        "run_dir": str(folder / "run"),
        "domain": {
            "name": "swe",
            "options": {
                "registry": str(registry),
                "preflight_dir": str(folder / "preflight"),
                "generator": "procedural",
                "solver_max_turns": 1,
                "solver_budget": 120,
                "sandbox_options": {
                    "time_limit": 60,
                    "memory_mb": 2048,
                    "max_processes": 64,
                    "python_env": str(test_env),
                },
            },
        },
        "generate": {"num_tasks": 2},
        "label": {"k": 3, "band_low": 1 / 3, "band_high": 2 / 3, "min_valid_attempts": 2},
        "solver": {"sampling": {"temperature": 0.7, "top_p": 0.95, "top_k": 20, "max_new_tokens": 16}},
        "probe": {
            "layers": [4, 8],
            "poolings": ["mean_last_half", "max"],
            "turn_vector": "last_token",
            "split": "grouped_kfold",
            "balance": ["weighted"],
        },
    }
    path = folder / "swe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, folder / "run"


def test_preflight_command(propel_cli, swe_config):
    path, run = swe_config
    done = propel_cli("-q", "swe", "preflight", str(path))
    assert "tinystats" in done.stdout and "kept 1 of 1" in done.stdout
    (row,) = json.loads((run / "swe" / "preflight.json").read_text())
    assert row["status"] == "ok" and row["tests"] == 7 and row["kept"]
    bad = propel_cli("-q", "swe", "preflight", str(path), "domain.options.split=eval", check=False)
    assert bad.returncode == 1 and "unknown split 'eval'; the registry has: no splits" in bad.stderr


def test_verdicts_command(propel_cli, swe_config):
    """``propel swe verdicts`` surveys the registry: the tiny repository's first bugs verified, each
    valid one's revert solved, no no-op or README edit solved, every fix shape solved."""
    path, run = swe_config
    done = propel_cli("-q", "swe", "verdicts", str(path), "--bugs", "2")
    (found,) = json.loads((run / "swe" / "verdicts.json").read_text())
    assert found["bugs"] == 2 and found["valid"] >= 1 and found["reverts_solved"] == found["valid"], found["rows"]
    assert found["no_ops_solved"] == 0 and found["readme_edits_solved"] == 0
    assert set(found["shapes_solved"].values()) == {1}
    assert "tinystats" in done.stdout and "verdicts.json" in done.stdout


def test_generate_label_extract(propel_cli, swe_config):
    path, run = swe_config
    propel_cli("-q", "generate", str(path))
    tasks = [json.loads(line) for line in (run / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == 2 and all(task["payload"]["generator"] == "procedural" for task in tasks)
    valid = [task for task in tasks if task["validity"]["valid"]]
    assert valid, [task["validity"]["reason"] for task in tasks]
    assert all(task["payload"]["failing_tests"] for task in valid)

    propel_cli("-q", "label", str(path))
    labels = [json.loads(line) for line in (run / "labels.jsonl").read_text().splitlines()]
    assert sorted(label["task_id"] for label in labels) == sorted(task["id"] for task in valid)
    for label in labels:
        assert len(label["attempts"]) == 3 and label["band"] == [1 / 3, 2 / 3]
        for attempt in label["attempts"]:
            record = json.loads(attempt["text"])  # the whole solver episode is kept
            assert record["status"] == "finished" and len(record["turns"]) == 1
            assert attempt["solved"] is not None  # finished episodes are always gradable

    propel_cli("-q", "extract", str(path))
    index = json.loads((run / "activations" / "index.json").read_text())
    assert index["task_ids"] == sorted(task["id"] for task in tasks) and index["turn_vector"] == "last_token"
    assert len(list((run / "activations").glob("*.safetensors"))) == 4
