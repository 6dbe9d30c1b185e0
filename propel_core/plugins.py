"""Plugin manager and component registry.

``get_plugin_manager()`` loads third-party plugins from the ``propel`` entry-point group, then the
built-ins in ``DEFAULT_PLUGINS``, which are ordinary plugin modules registered the same way.
``Registry`` asks every plugin's ``register_*`` hooks for components, remembers who gave what, and
hands components out by name.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from propel_core import hookspecs
from propel_core.contracts import ContextSampler, Executor, ReadsProbe, RepositorySandbox, RewardRule, Sandbox
from propel_core.errors import PropelError

DEFAULT_PLUGINS = (
    "propel_plugins.backends",
    "propel_plugins.executors",
    "propel_plugins.openai_backend",
    "propel_plugins.vllm_backend",
    "propel_plugins.poolers",
    "propel_plugins.probes",
    "propel_plugins.rewards",
    "propel_plugins.sandbox",
    "propel_plugins.samplers",
)

# kind -> (hook name, how the kind is called in messages)
KINDS: dict[str, tuple[str, str]] = {
    "domains": ("register_domains", "domain"),
    "validity_predicates": ("register_validity_predicates", "validity predicate"),
    "model_backends": ("register_model_backends", "model backend"),
    "poolers": ("register_poolers", "pooler"),
    "probe_architectures": ("register_probe_architectures", "probe architecture"),
    "reward_rules": ("register_reward_rules", "reward rule"),
    "context_samplers": ("register_context_samplers", "context sampler"),
    "sandboxes": ("register_sandboxes", "sandbox"),
    "executors": ("register_executors", "executor"),
}


class DuplicateComponent(PropelError):
    """Two plugins registered one kind of component under one name."""


class UnknownComponent(PropelError):
    """A config or call asked for a name nobody registered."""


def get_plugin_manager(load_entrypoints: bool = True) -> pluggy.PluginManager:
    """A fresh plugin manager: specs, entry-point plugins, then the built-ins.

    ``PROPEL_LOAD_PLUGINS=a,b`` loads only the entry-point plugins named ``a`` and ``b`` (by entry
    point or distribution name); an empty value loads none. Built-ins always load.
    """
    pm = pluggy.PluginManager("propel")
    pm.add_hookspecs(hookspecs)
    if load_entrypoints:
        allowed = os.environ.get("PROPEL_LOAD_PLUGINS")
        if allowed is None:
            pm.load_setuptools_entrypoints("propel")
        else:
            wanted = {name.strip() for name in allowed.split(",") if name.strip()}
            for ep in importlib.metadata.entry_points(group="propel"):
                if ep.name in wanted or (ep.dist and ep.dist.name in wanted):
                    pm.register(ep.load(), name=ep.name)
    for module_name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
    pm.check_pending()
    return pm


@dataclass(frozen=True)
class Component:
    kind: str
    name: str
    obj: Any
    plugin: str


@dataclass
class Registry:
    """Every registered component, by kind and name, with the plugin that gave it."""

    pm: pluggy.PluginManager
    components: dict[str, dict[str, Component]] = field(default_factory=dict)
    _backends: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(cls, pm: pluggy.PluginManager | None = None) -> Registry:
        registry = cls(pm or get_plugin_manager())
        for kind, (hook_name, _) in KINDS.items():
            registry.components[kind] = {}
            for impl in getattr(registry.pm.hook, hook_name).get_hookimpls():
                registry._collect(kind, impl)
        return registry

    def _collect(self, kind: str, impl: pluggy.HookImpl) -> None:
        plugin_name = impl.plugin_name
        label = KINDS[kind][1]

        def register(name: str, obj: Callable[..., Any]) -> None:
            existing = self.components[kind].get(name)
            if existing is not None:
                raise DuplicateComponent(
                    f"{label} {name!r} is registered twice: by plugin {existing.plugin!r} "
                    f"and by plugin {plugin_name!r}; uninstall one or disable it with PROPEL_LOAD_PLUGINS"
                )
            self.components[kind][name] = Component(kind, name, obj, plugin_name)

        impl.function(**{arg: register for arg in impl.argnames})

    def names(self, kind: str) -> list[str]:
        return sorted(self.components[kind])

    def get(self, kind: str, name: str) -> Any:
        """The registered component object; an unknown name lists the installed ones."""
        try:
            return self.components[kind][name].obj
        except KeyError:
            raise UnknownComponent(unknown_message(KINDS[kind][1], name, self.names(kind))) from None

    def context_sampler(self, name: str, contexts: list[Any], seed: int, **options: Any) -> ContextSampler:
        """The context sampler ``name`` over ``contexts``, seeded."""
        return self._checked("context_samplers", name, ContextSampler, contexts, seed=seed, **options)

    def reward_rule(self, name: str, config: Any) -> RewardRule:
        """The reward rule ``name`` for a ``RewardConfig``; a rule without ``needs`` reads the probe."""
        rule = self.get("reward_rules", name)(config)
        if not callable(rule):
            raise self._broken("reward_rules", name, rule, "a callable rule(task, scores) -> float")
        return rule if isinstance(rule, RewardRule) else ReadsProbe(rule)

    def sandbox(self, name: str, **options: Any) -> Sandbox:
        """The sandbox ``name`` with ``options``, for running programs (``run_python``)."""
        return self._checked("sandboxes", name, Sandbox, **options)

    def repository_sandbox(self, name: str, **options: Any) -> RepositorySandbox:
        """The sandbox ``name`` with ``options``, for running commands in checkouts (``workspace``)."""
        return self._checked("sandboxes", name, RepositorySandbox, **options)

    def executor(self, name: str, workers: int, **options: Any) -> Executor:
        """The executor ``name`` with ``workers`` jobs in flight at most."""
        return self._checked("executors", name, Executor, workers=workers, **options)

    def _checked(self, kind: str, name: str, contract: type, *args: Any, **kwargs: Any) -> Any:
        component = self.get(kind, name)(*args, **kwargs)
        if not isinstance(component, contract):
            raise self._broken(kind, name, component, f"a {contract.__name__} ({contract.__module__})")
        return component

    def _broken(self, kind: str, name: str, made: Any, wanted: str) -> PropelError:
        plugin = self.components[kind][name].plugin
        return PropelError(
            f"{KINDS[kind][1]} {name!r} of plugin {plugin!r} made a {type(made).__name__}, not {wanted}; "
            "see docs/plugin_hooks.md"
        )

    def backend(self, model: Any) -> Any:
        """The backend for a ``ModelConfig``, created on first use and shared by every caller that names
        the same model the same way (sampling differs per call, so it is not part of the key)."""
        key = model.model_dump_json(exclude={"sampling"})
        with self._lock:  # jobs in threads may ask at once: load each model once
            if key not in self._backends:
                self._backends[key] = self.get("model_backends", model.backend)(model)
        return self._backends[key]

    def domain(self, name: str, **options: Any) -> Any:
        """Create the domain ``name`` with ``options``, bound to its name and to this registry."""
        domain = self.get("domains", name)(**options)
        domain.name, domain.registry = name, self
        return domain

    def describe(self) -> list[dict[str, Any]]:
        """One entry per plugin: name, version and the component names it registers per kind."""
        versions = _plugin_versions()
        plugins: dict[str, dict[str, Any]] = {}
        for name, _ in self.pm.list_name_plugin():
            plugins[name] = {"name": name, "version": versions.get(name), "registers": {}}
        for kind, by_name in self.components.items():
            for component in by_name.values():
                plugins[component.plugin]["registers"].setdefault(kind, []).append(component.name)
        for entry in plugins.values():
            entry["registers"] = {k: sorted(v) for k, v in sorted(entry["registers"].items())}
        return sorted(plugins.values(), key=lambda p: p["name"])


def unknown_message(label: str, name: object, installed: list[str]) -> str:
    message = f"unknown {label} {name!r}; installed: {', '.join(installed) or '(none)'}"
    close = difflib.get_close_matches(str(name), installed, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message


def _plugin_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {
        ep.name: ep.dist.version if ep.dist else None for ep in importlib.metadata.entry_points(group="propel")
    }
    core_version = importlib.metadata.version("propel-core")
    for name in DEFAULT_PLUGINS:
        versions[name] = core_version
    return versions
