"""Registering stand-in modules for frameworks that cannot be installed here."""
from __future__ import annotations

import sys
import types


def register_modules(modules: dict) -> None:
    """Makes each dotted module of `modules` (and its parent packages)
    importable, with the names it maps to set on it."""
    for dotted, names in modules.items():
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                mod = types.ModuleType(name)
                mod.__path__ = []
                sys.modules[name] = mod
                if i > 1:
                    setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], mod)
        for attr, value in names.items():
            setattr(sys.modules[dotted], attr, value)
