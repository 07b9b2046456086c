"""The one list of transforms. Simple pipelines, compiled YAML, the Elyra catalog, the CLI and
the docs are all generated from it."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from prepline.errors import ConfigError
from prepline.transform import Transform

_REGISTRY: dict[str, type[Transform]] = {}
_loaded = False


def register(cls: type[Transform]) -> type[Transform]:
    """Class decorator: add a transform to the registry under its ``name``."""
    name = cls.name
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"transform name {name!r} must be a snake_case identifier")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"transform {name!r} registered twice")
    _REGISTRY[name] = cls
    return cls


def _load() -> None:
    global _loaded
    if _loaded:
        return
    import prepline.transforms as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if not mod.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{mod}")
    _loaded = True


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> type[Transform]:
    """The transform ``name``. Its module (same name) is imported alone when it exists, so a run
    pays for its own transform's imports only (the process start of every stage and worker)."""
    if name not in _REGISTRY and name.isidentifier() and not name.startswith("_"):
        import prepline.transforms as pkg

        if importlib.util.find_spec(f"{pkg.__name__}.{name}") is not None:
            importlib.import_module(f"{pkg.__name__}.{name}")
    if name not in _REGISTRY:
        _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown transform '{name}'", f"choose one of: {', '.join(sorted(_REGISTRY))} (see `prepline list`)"
        ) from None


def build(name: str, params: dict) -> Transform:
    """Construct a transform from its name and loosely typed parameters (validated)."""
    cls = get(name)
    return cls(cls.Config.from_params(params))
