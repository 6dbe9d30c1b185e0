"""propel: train task generators at the learnable frontier with probe rewards (PROPEL).

What a plugin author needs is importable from here: ``from propel_core import Domain, Task, Verdict,
hookimpl``. Each name lives in the module the table below names (where its docs are); it is imported
from there on first use, so ``import propel_core`` stays light (``propel --version`` and
``propel plugins`` load no model library).
"""

import importlib

import pluggy

hookimpl = pluggy.HookimplMarker("propel")

#: the plugin-facing names, by the module that defines them
PUBLIC = {
    "propel_core.domain": ("Domain", "Verdict", "ParseError", "Messages", "Reply", "ValidityPredicate", "make_task"),
    "propel_core.records": (
        "Context", "Task", "Validity", "SolverAttempt", "Label", "JsonlWriter", "iter_jsonl", "to_json", "encode",
    ),
    "propel_core.errors": ("PropelError", "RewardError", "Unavailable"),
    "propel_core.config": ("ModelConfig", "Sampling", "RewardConfig", "PropelConfig"),
    "propel_core.plans": ("load_config",),
    "propel_core.backend": (
        "ModelBackend", "HiddenStates", "Prompt", "Completion", "as_messages", "as_text", "prefill", "prompt_text",
        "before_stop", "end_tokens",
    ),
    "propel_core.embedded": ("cache_dir", "resolve_model"),
    "propel_core.contracts": (
        "RewardRule", "ContextSampler", "Sandbox", "RepositorySandbox", "Workspace", "Outcome", "SANDBOX_STATUSES",
        "Executor", "JobRunner", "Job", "Attempt", "Episode", "Grading",
    ),
    "propel_core.clock": ("RunClock",),
    "propel_core.execution": ("job_seed", "graded_texts"),
    "propel_core.services": ("Services",),
    "propel_core.run": ("Run", "start_run"),
    "propel_core.cli": ("start",),
}  # fmt: skip

_HOME = {name: module for module, names in PUBLIC.items() for name in names}

__all__ = ["hookimpl", *_HOME]


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'propel_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
