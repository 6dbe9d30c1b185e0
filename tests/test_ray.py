"""The ray executor on a real two-node Ray cluster started by the tests: AZR tasks labeled with the
solver served over HTTP (the embedded model behind an OpenAI-compatible loopback server) get the
same labels as with the local executor, and a worker node lost mid-run costs only its unfinished
attempts, which Ray redoes elsewhere."""

import json

import pytest

from propel_core.contracts import Attempt
from propel_core.domain import make_task
from propel_core.errors import PropelError
from propel_core.execution import job_seed, label_tasks
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.run import Run
from propel_core.worker import Worker

pytestmark = pytest.mark.slow

# AZR's own time limit: the labels are compared exactly, and the sandbox judges a run by its CPU and own
# time, so a busy machine (two test workers, a Ray cluster and a model on two cores) changes none of them
AZR = {"name": "azr", "options": {"min_inputs": 3, "shown": 1, "hidden": 2}}
RAY = {"name": "ray", "workers": 4, "options": {"resources": {"sandbox": 1}, "num_cpus": 1}}


@pytest.fixture(scope="module")
def azr_tasks():
    registry = Registry.build()
    if registry.get("sandboxes", "local")().missing_layers():
        pytest.skip("the AZR domain needs the local sandbox (bubblewrap, root)")
    domain = registry.domain("azr", **AZR["options"])
    predicates = registry.validity_predicates(domain)
    tasks = []
    for i, context in enumerate(domain.contexts()[:4]):
        inputs = "\n".join(json.dumps(args) for args in context.data["inputs"])
        text = f"<code>\n{context.data['code']}\n</code>\n<inputs>\n{inputs}\n</inputs>\n<message>hint</message>"
        tasks.append(make_task(f"a{i}", domain, context, text, "seed", predicates))
    assert all(task.validity.valid for task in tasks)
    return tasks


def azr_run(folder, server, executor) -> Run:
    config = validate_config(
        {
            "run_dir": str(folder),
            "seed": 3,
            "domain": AZR,
            "label": {"k": 2},
            "executor": executor,
            "solver": {
                "backend": "openai",
                "model": "smol",
                "base_url": server.url,
                "sampling": {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 24},
            },
        }
    )
    return Run(config, Registry.build(), quiet=True)


def by_task(labels):
    return sorted(labels, key=lambda label: label.task_id)


@pytest.fixture(scope="module")
def local_labels(azr_tasks, propel_loopback_server, tmp_path_factory):
    run = azr_run(tmp_path_factory.mktemp("local"), propel_loopback_server, {"name": "local", "workers": 4})
    return by_task(label_tasks(run.services, azr_tasks, run.dir / "labels.jsonl", run.plans.label))


def test_ray_labels_equal_local_labels(propel_ray_cluster, azr_tasks, propel_loopback_server, local_labels, tmp_path):
    run = azr_run(tmp_path, propel_loopback_server, RAY)
    labels = by_task(label_tasks(run.services, azr_tasks, tmp_path / "labels.jsonl", run.plans.label))
    assert labels == local_labels
    assert all(len(label.attempts) == 2 for label in labels)


def test_a_lost_worker_node_costs_only_its_unfinished_attempts(
    propel_ray_cluster, azr_tasks, propel_loopback_server, local_labels, tmp_path
):
    run = azr_run(tmp_path, propel_loopback_server, RAY)
    config = run.config
    worker = Worker(config.domain, config.solver, config.solver.sampling)
    jobs = [Attempt(task, j, job_seed(config.seed, task.id, j)) for task in azr_tasks for j in range(2)]
    (node,) = list(propel_ray_cluster.worker_nodes)
    finished = []
    try:
        for job, attempt in run.executor().run(worker, jobs):
            if not finished:  # the first attempt is back, 3 are in flight: the head runs 2 at most
                assert run.executor().in_flight == 3
                propel_ray_cluster.remove_node(node, allow_graceful=False)
            finished.append(((job.task.id, job.index), attempt))
    finally:
        propel_ray_cluster.add_node(num_cpus=2, resources={"sandbox": 2})
    assert sorted(key for key, _ in finished) == sorted((job.task.id, job.index) for job in jobs)  # each once
    expected = {(label.task_id, j): attempt for label in local_labels for j, attempt in enumerate(label.attempts)}
    assert dict(finished) == expected


def test_resources_no_node_offers_are_a_clear_error(propel_ray_cluster, propel_loopback_server, tmp_path):
    run = azr_run(tmp_path, propel_loopback_server, {"name": "ray", "options": {"resources": {"docker": 1}}})
    with pytest.raises(
        PropelError, match=r"no node of the Ray cluster offers docker: 1 \(cluster resources: .*sandbox: 4"
    ):
        run.executor()


LOCAL_RAY = """
import json, sys
import psutil
from propel_plugins.executors import RayExecutor

executor = RayExecutor(workers=1, num_cpus=1)
jobs = executor.ray.get(executor.ray.remote(lambda: 6 * 7).remote())  # it runs jobs
ours = [psutil.Process(), *psutil.Process().children(recursive=True)]
listening = set()
for process in ours:
    try:
        listening |= {c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    except psutil.NoSuchProcess:
        pass
print(json.dumps({"answer": jobs, "listening": sorted(listening)}))
"""


@pytest.mark.parametrize("address", [None, "local"])
def test_a_local_ray_listens_on_loopback_only(address):
    """The Ray instance the executor starts when no address is given (or ``local``): every server of
    it (GCS, raylet, object manager, workers) listens on loopback, not on the machine's other
    interfaces; one started with token authentication turned off is refused."""
    import ipaddress
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env |= {"RAY_ADDRESS": address} if address else {}
    done = subprocess.run([sys.executable, "-c", LOCAL_RAY], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["answer"] == 42 and found["listening"]
    assert all(ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback for ip in found["listening"]), found
    refused = subprocess.run(
        [sys.executable, "-c", LOCAL_RAY], env=env | {"RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True
    )
    assert refused.returncode == 1 and "RAY_AUTH_MODE=disabled would start a local Ray" in refused.stderr
