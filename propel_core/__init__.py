"""propel: train task generators at the learnable frontier with probe rewards (PROPEL)."""

import pluggy

hookimpl = pluggy.HookimplMarker("propel")

__all__ = ["hookimpl"]
