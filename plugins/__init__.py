"""propel's generic built-in plugins, installed as ``propel_plugins`` and registered by default."""
