"""scripts/setup.sh picks the torch build as the README says: on a machine without a GPU, the CPU build
from PyTorch's CPU index where that index answers, else from PyPI (or the build a machine keeps on
disk); TORCH_SPEC wins. The index is a real HTTP server on the loopback here."""

import functools
import http.server
import socket
import subprocess
import threading
from pathlib import Path

import pytest

SETUP = Path(__file__).parents[1] / "scripts" / "setup.sh"


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
