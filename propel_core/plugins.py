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
import inspect
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from propel_core import hookspecs
from propel_core.contracts import ContextSampler, Executor, ReadsProbe, RepositorySandbox, RewardRule, Sandbox
from propel_core.errors import FILE_ERRNOS, PropelError

log = logging.getLogger("propel")

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

#: kind -> how the core calls a factory of that kind before the user's options: the number of
#: positional arguments it passes, and the keywords it sets itself (kinds the core calls with no
#: options of the user's are left out)
CALLS: dict[str, tuple[int, tuple[str, ...]]] = {
    "domains": (0, ()),
    "model_backends": (1, ()),
    "reward_rules": (1, ()),
    "context_samplers": (1, ("seed",)),
    "executors": (0, ("workers",)),
    "sandboxes": (0, ()),
}


class DuplicateComponent(PropelError):
    """Two plugins registered one kind of component under one name."""


class UnknownComponent(PropelError):
    """A config or call asked for a name nobody registered."""


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry-point plugin that failed to import or to register, and was left out."""

    name: str
    distribution: str | None
    error: str

    def line(self) -> str:
        """One line naming the plugin, its distribution and the fix."""
        remove = f"pip uninstall {self.distribution}" if self.distribution else "uninstall it"
        return (
            f"plugin {self.name!r}" + (f" (distribution {self.distribution})" if self.distribution else "")
            + f" is broken and was left out: {self.error}; fix it, {remove}, or load only the plugins you"
            " want with PROPEL_LOAD_PLUGINS=name,..."
        )  # fmt: skip


class PluginManager(pluggy.PluginManager):
    """pluggy's plugin manager, with the entry-point plugins that could not be loaded (``broken``)."""

    def __init__(self) -> None:
        super().__init__("propel")
        self.broken: list[BrokenPlugin] = []

    def leave_out(self, name: str, distribution: str | None, exc: BaseException) -> None:
        """Unregister plugin ``name`` (if it got that far) and remember why it is broken."""
        if self.get_plugin(name) is not None:
            self.unregister(name=name)
        self.broken.append(BrokenPlugin(name, distribution, f"{type(exc).__name__}: {str(exc)[:200]}"))
        log.warning("propel: %s", self.broken[-1].line())


def get_plugin_manager(load_entrypoints: bool = True) -> PluginManager:
    """A fresh plugin manager: specs, entry-point plugins, then the built-ins.

    ``PROPEL_LOAD_PLUGINS=a,b`` loads only the entry-point plugins named ``a`` and ``b`` (by entry
    point or distribution name); an empty value loads none. Built-ins always load. An entry-point
    plugin that fails to import or to register is left out and listed in ``broken``; the others load.
    """
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    if load_entrypoints:
        allowed = os.environ.get("PROPEL_LOAD_PLUGINS")
        wanted = None if allowed is None else {name.strip() for name in allowed.split(",") if name.strip()}
        for ep in importlib.metadata.entry_points(group="propel"):
            distribution = ep.dist.name if ep.dist else None
            if pm.get_plugin(ep.name) is not None or (wanted is not None and not {ep.name, distribution} & wanted):
                continue
            try:
                pm.register(ep.load(), name=ep.name)
                pm.check_pending()  # a hook no spec knows: the plugin was written for another propel
            except Exception as exc:
                pm.leave_out(ep.name, distribution, exc)
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
    _distributions: dict[str, tuple[str, str]] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, pm: pluggy.PluginManager | None = None) -> Registry:
        """Every plugin's components; a plugin whose ``register_*`` hook raises is left out whole (its
        components too) and listed in ``broken``, like one that failed to import."""
        registry = cls(pm or get_plugin_manager())
        registry.components = {kind: {} for kind in KINDS}
        for kind, (hook_name, _) in KINDS.items():
            for impl in getattr(registry.pm.hook, hook_name).get_hookimpls():
                try:
                    registry._collect(kind, impl)
                except DuplicateComponent:
                    raise
                except Exception as exc:
                    registry._leave_out(impl.plugin_name, exc)
        return registry

    @property
    def broken(self) -> list[BrokenPlugin]:
        return list(getattr(self.pm, "broken", []))

    def _leave_out(self, plugin_name: str, exc: Exception) -> None:
        for by_name in self.components.values():
            for name in [name for name, component in by_name.items() if component.plugin == plugin_name]:
                del by_name[name]
        distributions = {ep.name: ep.dist.name for ep in importlib.metadata.entry_points(group="propel") if ep.dist}
        if isinstance(self.pm, PluginManager):
            self.pm.leave_out(plugin_name, distributions.get(plugin_name), exc)
        else:
            raise exc

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
            raise UnknownComponent(self.unknown(kind, name)) from None

    def unknown(self, kind: str, name: object) -> str:
        """Why ``name`` is no installed component of ``kind``: the installed ones, the closest, and every
        broken plugin (one of which may be where it would have come from)."""
        message = unknown_message(KINDS[kind][1], name, self.names(kind))
        return "; ".join([message, *(plugin.line() for plugin in self.broken)])

    def check_options(self, kind: str, name: str, options: dict[str, Any], within: tuple[str, ...] = ()) -> list[str]:
        """What is wrong with calling component ``name`` of ``kind`` with ``options``, read from its
        factory's signature before anything runs: a factory propel cannot call the way it calls that
        kind, an option it does not take (with the ones it does, and the closest), one it needs and is
        not given, a value pydantic cannot read as its parameter's annotation. A value pydantic reads is
        put back as read where it is a plain scalar (``"false"`` for a ``bool`` is False, not a true
        string); a container stays as written. Options that hold another component's options (the
        factory's ``component_options``: ``{"sandbox_options": ("sandboxes", "sandbox")}``) are checked
        against that component in turn (``within``: the components on the way, so a cycle ends)."""
        factory = self.get(kind, name)
        label = f"{KINDS[kind][1]} {name!r}"
        try:
            parameters = list(inspect.signature(factory).parameters.values())
        except (TypeError, ValueError):  # a callable with no signature to read: it sees them at run time
            return []
        positional, keywords = CALLS[kind]
        problems = _call_shape_problems(label, parameters, positional, keywords)
        named = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        taken = {p.name for p in parameters[:positional]} | set(keywords)
        valid = [p for p in named if p not in taken]
        for key in options:
            if key in keywords:
                problems.append(f"{label} option {key!r} is set by propel itself; leave it out")
            elif key not in valid and not any(p.kind is p.VAR_KEYWORD for p in parameters):
                problem = f"{label} takes no option {key!r}; its options: {', '.join(valid) or '(none)'}"
                close = difflib.get_close_matches(str(key), valid, n=1)
                problems.append(problem + (f" (did you mean {close[0]!r}?)" if close else ""))
        problems += [
            f"{label} needs the option {p!r}" for p in valid if named[p].default is named[p].empty and p not in options
        ]
        for key in [key for key in options if key in valid]:
            annotation = _resolved(factory, named[key].annotation)
            if annotation is not None:
                problem, options[key] = _read_as(annotation, options[key])
                problems += [f"{label} option {key!r} = {options[key]!r}: {problem}"] if problem else []
        for held, (inner_kind, naming) in getattr(factory, "component_options", {}).items():
            inner = options.get(naming, named[naming].default if naming in named else None)
            held_options = options.get(held) or {}
            if inner_kind not in CALLS:
                problems.append(
                    f"{label} declares component_options {held!r} of kind {inner_kind!r}, which takes no options "
                    f"from the config; kinds that do: {', '.join(sorted(CALLS))}"
                )
            elif f"{inner_kind}/{inner}" in (*within, f"{kind}/{name}"):
                problems.append(f"{label} option {held!r} names {inner!r}, whose options hold its own (a cycle)")
            elif isinstance(held_options, dict) and isinstance(inner, str):
                if inner not in self.names(inner_kind):
                    found = [self.unknown(inner_kind, inner)]
                else:
                    found = self.check_options(inner_kind, inner, held_options, (*within, f"{kind}/{name}"))
                problems += [f"{label} option {held!r}: {problem}" for problem in found]
        return problems

    def with_defaults(self, kind: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` (valid ones, as ``check_options`` passed them), then every option the component's
        factory takes and was not given, at its default (not the ones propel sets itself), the options
        of a component it holds (``component_options``) filled the same way: what the component runs
        with. A default that is not plain data (``plain_data``: a function, an object, a set, NaN) is
        left out, as it has no spelling that is the same in every process. A kind the config gives no
        options to, or a factory without a signature, is left as given."""
        if kind not in CALLS:
            return dict(options)
        factory = self.get(kind, name)
        try:
            parameters = list(inspect.signature(factory).parameters.values())
        except (TypeError, ValueError):
            return dict(options)
        positional, keywords = CALLS[kind]
        taken = {p.name for p in parameters[:positional]} | set(keywords)
        out = dict(options) | {
            p.name: json.loads(json.dumps(p.default))  # a tuple as the list a record reads back
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.default is not p.empty
            and p.name not in taken
            and p.name not in options
            and plain_data(p.default)
        }
        for held, (inner_kind, naming) in getattr(factory, "component_options", {}).items():
            inner, inner_options = out.get(naming), out.get(held) or {}
            if isinstance(inner, str) and inner in self.names(inner_kind) and isinstance(inner_options, dict):
                out[held] = self.with_defaults(inner_kind, inner, inner_options)
        return out

    def made_by(self, kind: str, name: str) -> str:
        """The distribution and version that registered component ``name`` of ``kind`` (``propel-core
        0.1.0`` for a built-in), or the plugin's name where no installed distribution has it (one
        registered by hand, in a test)."""
        plugin = self.components[kind][name].plugin
        found = self.distributions().get(plugin)
        return f"{found[0]} {found[1]}" if found else f"plugin {plugin} (no distribution)"

    def distributions(self) -> dict[str, tuple[str, str]]:
        """plugin name -> (distribution, version) of every installed propel plugin, the built-ins
        propel-core's; read once a registry (the installed distributions do not change under it)."""
        if self._distributions is None:
            found = {
                ep.name: (ep.dist.name, ep.dist.version)
                for ep in importlib.metadata.entry_points(group="propel")
                if ep.dist is not None
            }
            core = ("propel-core", importlib.metadata.version("propel-core"))
            self._distributions = found | {name: core for name in DEFAULT_PLUGINS}
        return self._distributions

    def validity_predicates(self, domain: Any) -> dict[str, Callable[..., Any]]:
        """The validity predicates ``domain`` names (``Domain.validity_predicates``), by name, in its order."""
        return {name: self.get("validity_predicates", name) for name in domain.validity_predicates}

    def context_sampler(self, name: str, contexts: list[Any], seed: int, **options: Any) -> ContextSampler:
        """The context sampler ``name`` over ``contexts``, seeded."""
        return self._checked("context_samplers", name, ContextSampler, contexts, seed=seed, **options)

    def reward_rule(self, name: str, config: Any) -> RewardRule:
        """The reward rule ``name`` for a ``RewardConfig``, with its options (``config.options[name]``);
        a rule without ``needs`` reads the probe."""
        rule = self.made("reward_rules", name, config, **config.options.get(name, {}))
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

    def made(self, kind: str, name: str, *args: Any, **options: Any) -> Any:
        """The component ``name`` of ``kind``, made by its factory from ``args`` (what the core passes)
        and ``options`` (the user's, and keywords the core sets). Whatever the factory raises on them,
        but a ``PropelError``, becomes one line naming the component, its plugin and the options given:
        a constructor that checks its options may raise any error (the traceback is in the debug log). A
        full or read-only disk stays the error the command line explains (``errors.file_error``)."""
        factory = self.get(kind, name)
        try:
            return factory(*args, **options)
        except PropelError:
            raise
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in FILE_ERRNOS:
                raise
            log.debug("%s %r could not be made", KINDS[kind][1], name, exc_info=True)
            given = ", ".join(f"{key}={value!r}" for key, value in options.items())
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise PropelError(
                f"{KINDS[kind][1]} {name!r} of plugin {self.components[kind][name].plugin!r} could not be made "
                f"(options: {given[:200] or 'none'}): {reason}"
            ) from exc

    def _checked(self, kind: str, name: str, contract: type, *args: Any, **kwargs: Any) -> Any:
        component = self.made(kind, name, *args, **kwargs)
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
                self._backends[key] = self.made("model_backends", model.backend, model, **model.options)
        return self._backends[key]

    def domain(self, name: str, **options: Any) -> Any:
        """Create the domain ``name`` with ``options``, bound to its name and to this registry."""
        domain = self.made("domains", name, **options)
        stop = getattr(domain, "stop_strings", ())
        if isinstance(stop, str) or not all(isinstance(text, str) and text for text in stop):
            raise PropelError(f"domain {name!r}: stop_strings must be a tuple of non-empty strings, got {stop!r}")
        domain.name, domain.registry = name, self
        return domain

    def describe(self) -> list[dict[str, Any]]:
        """One entry per plugin: name, version and the component names it registers per kind."""
        versions = {name: version for name, (_, version) in self.distributions().items()}
        plugins: dict[str, dict[str, Any]] = {}
        for name, _ in self.pm.list_name_plugin():
            plugins[name] = {"name": name, "version": versions.get(name), "registers": {}}
        for kind, by_name in self.components.items():
            for component in by_name.values():
                plugins[component.plugin]["registers"].setdefault(kind, []).append(component.name)
        for entry in plugins.values():
            entry["registers"] = {k: sorted(v) for k, v in sorted(entry["registers"].items())}
        for plugin in self.broken:
            plugins[plugin.name] = {"name": plugin.name, "version": versions.get(plugin.name), "registers": {}}
            plugins[plugin.name]["broken"] = plugin.error
        return sorted(plugins.values(), key=lambda p: p["name"])


def unknown_message(label: str, name: object, installed: list[str]) -> str:
    message = f"unknown {label} {name!r}; installed: {', '.join(installed) or '(none)'}"
    close = difflib.get_close_matches(str(name), installed, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message


def _call_shape_problems(label: str, parameters: list[Any], positional: int, keywords: tuple[str, ...]) -> list[str]:
    """Whether a factory takes the ``positional`` arguments and the ``keywords`` propel passes it."""
    takes_args = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters) >= positional
    takes_args = takes_args or any(p.kind is p.VAR_POSITIONAL for p in parameters)
    keyworded = {p.name for p in parameters[positional:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [k for k in keywords if k not in keyworded and not any(p.kind is p.VAR_KEYWORD for p in parameters)]
    if takes_args and not missing:
        return []
    wanted = f"{positional} positional argument(s)" + (f" and the keyword(s) {', '.join(keywords)}" if keywords else "")
    return [f"{label}'s factory cannot be called as propel calls it, with {wanted}; see docs/plugin_hooks.md"]


def _resolved(factory: Any, annotation: Any) -> Any:
    """A parameter's annotation as an object (a string one, under ``from __future__ import
    annotations``, read in the factory's module); None when there is none or it cannot be read."""
    if annotation is inspect.Parameter.empty:
        return None
    if not isinstance(annotation, str):
        return annotation
    target = getattr(factory, "func", factory)  # functools.partial
    module = sys.modules.get(getattr(target, "__module__", None) or type(target).__module__)
    try:
        return eval(annotation, dict(vars(module)) if module else {})  # the plugin's own code, not model output
    except Exception:
        return None


def _read_as(annotation: Any, value: Any) -> tuple[str | None, Any]:
    """``value`` read as its annotation by pydantic (lax: 1 is a float, ``"false"`` a bool): the problem
    (None when it reads) and the value to pass: a scalar as read, anything else as written (pydantic
    reads an ``Iterable`` as a one-shot iterator and a ``set`` in no fixed order); a value whose
    annotation pydantic cannot read is kept."""
    from pydantic import TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(annotation)
    except Exception:
        return None, value
    try:
        read = adapter.validate_python(value)
    except ValidationError as exc:
        return exc.errors()[0]["msg"], value
    return None, read if isinstance(read, bool | int | float | str) else value  # a container stays as written


def plain_data(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is JSON's own data, written the same way in every process: None, a bool, an
    int, a finite float, a str, or a list, tuple or str-keyed dict of those (not too deep)."""
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if depth > 8:
        return False
    if isinstance(value, list | tuple):
        return all(plain_data(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and plain_data(item, depth + 1) for key, item in value.items())
    return False
