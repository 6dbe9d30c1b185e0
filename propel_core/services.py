"""What the library gets from the run it works in, and no setting: :class:`Services`.

A recipe (a stage, a script, a benchmark) hands a library function this handle and the plan of the
call (``propel_core.plans``); ``Run.services`` builds it for a run. The domain, the executor and the trackers are built
on first use, once per run, whoever asks first.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from propel_core.config import ModelConfig
    from propel_core.contracts import Executor
    from propel_core.domain import Domain
    from propel_core.plugins import Registry
    from propel_core.tracking import Tracker
    from propel_core.worker import Worker


@dataclass(frozen=True)
class Services:
    """The registry, the run folder (``dir``), the domain, the executor and what a job runs with
    (``worker(model)``), the trackers (``tracker()``, ``track(stage, metrics, step)``), progress bars
    (``progress(description, total)``, silent when ``quiet``), ``say`` for what the user is told, and
    the ungradable attempts met so far (``ungradable_kinds``, the kinds logged; ``ungradable``, a line
    per stage that met some)."""

    registry: Registry
    dir: Path
    domain: Callable[[], Domain]
    executor: Callable[[], Executor]
    worker: Callable[[ModelConfig], Worker]
    tracker: Callable[[], Tracker]
    track: Callable[[str, dict[str, Any], int], None]
    progress: Callable[[str, int], AbstractContextManager[Callable[..., None]]]
    say: Callable[[str], None]
    quiet: bool = False
    ungradable: list[str] = field(default_factory=list)
    ungradable_kinds: set[str] = field(default_factory=set)
