"""The docker sandbox against a real engine: limits, no network, no socket, timeouts, cleanup, and
the domain's preflight, verifier and solver trials in containers.

The session starts a private engine (``dockerd --iptables=false --bridge=none``, as root) unless
``DOCKER_HOST`` or the default socket already answers, imports a base image built from this
machine's files (no registry needed), and stops the engine at the end. Without an engine the tests
skip with the reason.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from swe_helpers import BUG, fenced, scripted, write_registry

from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.testing import MEMORY_PINNERS, wait_until_up
from propel_plugins.sandbox import SandboxUnavailable
from propel_swe.docker_sandbox import LABEL, DockerSandbox

IMAGE = "propel-swe-test:base"


def _client():
    import docker

    client = docker.from_env(timeout=60)
    client.ping()
    return client


@pytest.fixture(scope="session")
def engine(tmp_path_factory, test_env):
    """A docker client on a running engine with the base image imported."""
    started = None
    with pytest.MonkeyPatch.context() as patch:
        try:
            client = _client()
        except Exception as exc:  # no engine answers: start a private one where we can
            if shutil.which("dockerd") is None or os.geteuid() != 0:
                pytest.skip(f"no Docker engine ({exc}) and none can be started here (needs dockerd and root)")
            folder = tmp_path_factory.mktemp("dockerd")
            socket = folder / "docker.sock"
            log = (folder / "dockerd.log").open("w")
            started = subprocess.Popen(
                [
                    "dockerd",
                    "--iptables=false",
                    "--bridge=none",
                    f"--data-root={folder / 'data'}",
                    f"--exec-root={folder / 'exec'}",
                    f"--pidfile={folder / 'dockerd.pid'}",
                    f"--host=unix://{socket}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            patch.setenv("DOCKER_HOST", f"unix://{socket}")
            client = wait_until_up(started, _client, timeout=60)
            if client is None:
                pytest.skip(f"dockerd did not start: {(folder / 'dockerd.log').read_text()[-500:]}")
        done = subprocess.run(
            [str(Path(sys.executable).with_name("propel")), "swe", "image", IMAGE, "--python-env", str(test_env)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0 and f"imported {IMAGE}" in done.stdout, done.stderr
        yield client
        for container in client.containers.list(all=True, filters={"label": LABEL}):
            container.remove(force=True)
        if started is not None:
            started.send_signal(signal.SIGTERM)
            started.wait(60)


def leftovers(client):
    return client.containers.list(all=True, filters={"label": LABEL})


def test_limits_no_network_no_socket_and_cleanup(engine, tiny_repo):
    sandbox = DockerSandbox(base_image=IMAGE, disk_gb=None)
    with sandbox.workspace(path=tiny_repo) as ws:
        host = engine.containers.get(ws.container.id).attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"] and host["CapAdd"] is None
        cpus = min(2, engine.info()["NCPU"])  # the default, or the engine's CPUs where it has fewer
        assert host["NanoCpus"] == cpus * 1_000_000_000 and host["Memory"] == 4 << 30 and host["PidsLimit"] == 512
        assert host["SecurityOpt"] == ["no-new-privileges"] and not host["Binds"] and not host["Privileged"]
        assert engine.containers.get(ws.container.id).attrs["Mounts"] == []
        interfaces = ws.run("ls /sys/class/net")
        assert interfaces.stdout.split() == ["lo"]
        assert ws.run("test -e /var/run/docker.sock").returncode == 1
        assert ws.run("git log --oneline | wc -l").stdout.strip() == "1"
        ws.write("notes.txt", b"hello")
        assert ws.read("notes.txt") == b"hello"
    assert leftovers(engine) == []


def test_disk_limit_fails_closed_where_the_engine_cannot_enforce_it(engine, tiny_repo):
    sandbox = DockerSandbox(base_image=IMAGE, disk_gb=10)
    try:
        with sandbox.workspace(path=tiny_repo) as ws:
            assert engine.containers.get(ws.container.id).attrs["HostConfig"]["StorageOpt"] == {"size": "10G"}
    except SandboxUnavailable as exc:
        assert "set disk_gb: null" in str(exc)
    assert leftovers(engine) == []


def test_a_command_past_its_limit_times_out_and_the_workspace_goes_on(engine, tiny_repo):
    with DockerSandbox(base_image=IMAGE, disk_gb=None).workspace(path=tiny_repo) as ws:
        started = time.monotonic()
        result = ws.run("sleep 60", time_limit=2)
        assert result.status == "timeout" and time.monotonic() - started < 10
        assert ws.run("echo still here").stdout == "still here\n"
    assert leftovers(engine) == []


def test_the_domain_in_docker(engine, tiny_repo, tmp_path):
    registry = write_registry(tmp_path, [{"name": "tinystats", "path": str(tiny_repo)}])
    domain = Registry.build().domain(
        "swe",
        registry=str(registry),
        preflight_dir=str(tmp_path / "preflight"),
        sandbox="docker",
        sandbox_options={"base_image": IMAGE, "disk_gb": None},
    )
    baseline = domain.baseline(domain.repos["tinystats"])
    assert baseline.keep and baseline.test_count == 7
    payload = {"repo": "tinystats", "diff": BUG, "turns": ["x"]}
    assert domain.verify(payload).valid and payload["failing_tests"] == ["tests/test_core.py::test_clamp"]
    fix = fenced(
        "edit", "tinystats/core.py\n<<<<<<< SEARCH\n    if value > low:\n=======\n    if value > high:\n>>>>>>> REPLACE"
    )
    attempt = domain.solver_episode(payload, scripted(fix, fenced("submit")))
    assert json.loads(attempt)["status"] == "finished"
    assert domain.grade(payload, attempt).solved is True
    nothing = domain.solver_episode(payload, scripted(fenced("submit")))
    assert domain.grade(payload, nothing).solved is False
    assert leftovers(engine) == []


@pytest.fixture(scope="session")
def mle_image(engine):
    """A base image whose environment has the MLE domain's numpy, pandas and scikit-learn (the
    versions installed here, from pip's cache when there is one)."""
    pytest.importorskip("propel_mle")
    from importlib.metadata import version

    from propel_core.embedded import cache_dir
    from propel_swe.checkout import python_environment
    from propel_swe.image import import_image

    packages = [f"{name}=={version(name)}" for name in ("numpy", "pandas", "scikit-learn")]
    try:
        env = python_environment(cache_dir() / "mle" / "docker-env", packages)
    except PropelError as exc:
        pytest.skip(str(exc))
    import_image(engine, "propel-mle-test:base", env)
    return "propel-mle-test:base", env


def test_the_mle_domain_in_docker(mle_image):
    """The ML-engineering RL study's environment in a container: markers, the held-out score, scikit-learn's data hidden."""
    from propel_mle.environment import MARKERS
    from propel_mle.plugin import TASKS, solution

    image, env = mle_image
    domain = Registry.build().domain(
        "mle", sandbox="docker", python_env=str(env), sandbox_options={"base_image": image, "disk_gb": None}
    )
    iris = TASKS[0]
    verdict = domain.grade(iris, "```python\n" + solution(iris) + "```")
    assert verdict.diagnostics["markers"] == list(MARKERS) and verdict.solved is True, verdict.reason
    verdict = domain.grade(iris, "```python\nimport numpy\nraise SystemExit(3)\n```")
    assert verdict.diagnostics["markers"] == ["imports"] and verdict.diagnostics["verifier_score"] is None
    peek = "from sklearn.datasets import load_iris\nload_iris()\n"
    verdict = domain.grade(iris, f"```python\n{peek}```")
    assert "sklearn.datasets.data" in verdict.reason, verdict.reason  # the container's copy of the data is gone


def test_nothing_outlives_its_command_and_reads_are_bounded(engine, tiny_repo):
    """A process a command leaves running is killed when the command ends (as in the local sandbox),
    a large file is read only up to the limit, and a folder is refused without being fetched."""
    with DockerSandbox(base_image=IMAGE, disk_gb=None).workspace(path=tiny_repo) as ws:
        ws.run("(while true; do touch /tmp/alive; sleep 0.1; done) > /dev/null 2>&1 &")
        assert ws.run("rm -f /tmp/alive; sleep 0.5; test ! -e /tmp/alive").returncode == 0
        ws.run("head -c 50000000 /dev/zero > big.bin && mkdir folder")
        assert len(ws.read("big.bin", 1000)) == 1000
        with pytest.raises(PropelError, match="not a regular file"):
            ws.read("folder")
    assert leftovers(engine) == []


def test_hidden_paths_are_gone_from_every_container(engine, tiny_repo):
    sandbox = DockerSandbox(base_image=IMAGE, disk_gb=None, hide=["/etc/passwd", "/usr/bin/git"])
    with sandbox.workspace(path=tiny_repo) as ws:
        assert ws.run("test ! -e /etc/passwd && test ! -e /usr/bin/git").returncode == 0
    with pytest.raises(PropelError, match="absolute"):
        DockerSandbox(base_image=IMAGE, disk_gb=None, hide=["relative/path"])


def test_the_memory_limit_counts_what_address_space_limits_miss(engine, tiny_repo):
    """The container's cgroup bounds every way of pinning memory (propel_core.testing's hostile
    programs), and a command's own exit status is never read as one of the harness's limits."""
    bound_mib = 256
    with DockerSandbox(base_image=IMAGE, disk_gb=None, memory_gb=bound_mib / 1024).workspace(path=tiny_repo) as ws:
        for name, program in MEMORY_PINNERS.items():
            ws.write("pin.py", program.encode())
            result = ws.run("rm -f result.json; python pin.py", time_limit=60)
            assert result.status in ("ok", "oom", "error"), (name, result.status, result.stderr[-300:])
            if result.status == "ok":
                pinned = json.loads(ws.read("result.json"))
                assert pinned <= bound_mib, f"{name}: {pinned} MiB pinned under a limit of {bound_mib} MiB"
        assert ws.run("python -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * len(b[::4096])'").status == "oom"
        assert ws.run("exit 124").status == "error" and ws.run("exit 137").status == "error"
