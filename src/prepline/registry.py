"""The one list of transforms. Simple pipelines, compiled YAML, the Elyra catalog, the CLI and
the docs are all generated from it.

Two sources fill it: the built-in transforms (every module of :mod:`prepline.transforms`) and
**plug-ins**, installed distributions that declare an entry point in the group :data:`GROUP`::

    [project.entry-points."prepline.transforms"]
    char_count = "prepline_char_count:CharCount"   # a Transform class (the entry point's name is its name)
    # or: my_transforms = "my_package.transforms"  # a module: every Transform class defined in it

Built-ins load first; plug-ins load the first time something asks for the whole list
(:func:`names`) or for a name that is not built in, so ``prepline run doc_id`` never imports them.
A broken plug-in (does not import, clashes with a built-in or another plug-in, names no Transform)
is a :class:`~prepline.errors.ConfigError` naming its distribution and entry point: loud, never
skipped, because a catalog or pipeline that silently lacks a transform the user installed is worse
than an error that says which package to fix or uninstall.

Generated files that ship with prepline (``compiled/``, ``elyra_templates/``, ``docs/``) are made
under :func:`scope` ``(plugins=False)``, so the plug-ins of a developer's environment never leak
into them (nor break their ``--check``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

from prepline.config import TransformConfig
from prepline.errors import ConfigError
from prepline.transform import Transform

#: the entry-point group plug-in distributions declare their transforms in
GROUP = "prepline.transforms"


@dataclass(frozen=True)
class Plugin:
    """Where a plug-in transform comes from: its distribution and entry point."""

    distribution: str
    version: str
    entry_point: str  # "name = value", as declared

    def where(self) -> str:
        return f"entry point '{self.entry_point}' (group {GROUP}) of distribution '{self.distribution}' {self.version}"

    def fix(self, what: str) -> str:
        return f"{what} in '{self.distribution}', or uninstall it: pip uninstall {self.distribution}"


_REGISTRY: dict[str, type[Transform]] = {}
_ORIGIN: dict[str, Plugin] = {}  # plug-in transforms only
_loaded = {"builtins": False, "plugins": False}
_PLUGINS_ON: ContextVar[bool] = ContextVar("prepline_registry_plugins", default=True)


def register(cls: type[Transform]) -> type[Transform]:
    """Class decorator: add a transform to the registry under its ``name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ConfigError(f"transform class {cls.__qualname__}: name {name!r} is not a snake_case identifier",
                          "set the class attribute name = 'my_transform'")
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, TransformConfig)):
        raise ConfigError(f"transform {name!r} ({cls.__qualname__}): Config is not a TransformConfig dataclass",
                          "set Config to a frozen dataclass deriving from prepline.config.TransformConfig")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        owner = _ORIGIN.get(name)
        by = f"by {owner.where()}" if owner else f"as a built-in transform ({_REGISTRY[name].__module__})"
        raise ConfigError(f"transform {name!r} ({cls.__module__}.{cls.__qualname__}) is already registered {by}",
                          "give the transform another name")
    _REGISTRY[name] = cls
    return cls


@contextmanager
def scope(plugins: bool) -> Iterator[None]:
    """Within it, :func:`names` and :func:`get` see plug-ins (``plugins=True``) or built-ins only."""
    token = _PLUGINS_ON.set(plugins)
    try:
        yield
    finally:
        _PLUGINS_ON.reset(token)


def _load_builtins() -> None:
    if _loaded["builtins"]:
        return
    import prepline.transforms as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if not mod.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{mod}")
    _loaded["builtins"] = True


def _load_plugins() -> None:
    _load_builtins()
    if _loaded["plugins"] or not _PLUGINS_ON.get():
        return
    for ep in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        _load_plugin(ep)
    _loaded["plugins"] = True


def _plugin_of(ep: importlib.metadata.EntryPoint) -> Plugin:
    dist = ep.dist
    return Plugin(dist.name if dist else "?", dist.version if dist else "?", f"{ep.name} = {ep.value}")


def _transforms_in(obj: object, ep: importlib.metadata.EntryPoint, plugin: Plugin) -> list[type[Transform]]:
    """The Transform classes an entry point names: the class itself, or those a module defines."""
    if isinstance(obj, type) and issubclass(obj, Transform):
        if obj.__dict__.get("name") != ep.name:
            raise ConfigError(f"{plugin.where()}: names class {obj.__qualname__} whose name is {obj.__dict__.get('name')!r}, not {ep.name!r}",
                              plugin.fix(f"give the entry point and the class's name attribute the same name ({ep.name!r})"))
        return [obj]
    if isinstance(obj, ModuleType):
        found = [v for v in vars(obj).values()
                 if isinstance(v, type) and issubclass(v, Transform) and v.__module__ == obj.__name__ and "name" in v.__dict__]
        if found:
            return sorted(found, key=lambda c: c.name)
        raise ConfigError(f"{plugin.where()}: module {obj.__name__} defines no Transform class with a name",
                          plugin.fix("point the entry point at a module defining a prepline.transform.Transform subclass, or at the class"))
    raise ConfigError(f"{plugin.where()}: {ep.value} is a {type(obj).__name__}, not a Transform class or a module",
                      plugin.fix("point the entry point at a prepline.transform.Transform subclass (module:Class) or a module"))


def _load_plugin(ep: importlib.metadata.EntryPoint) -> None:
    """Import one entry point and register its transforms; on any error, register none of them."""
    plugin = _plugin_of(ep)
    before = dict(_REGISTRY)
    try:
        obj = ep.load()
        for cls in _transforms_in(obj, ep, plugin):
            register(cls)
    except ConfigError as e:
        _REGISTRY.clear()
        _REGISTRY.update(before)
        if plugin.distribution in e.message:
            raise
        raise ConfigError(f"{plugin.where()}: {e.message}", plugin.fix(e.fix or "fix the plug-in")) from e
    except Exception as e:  # noqa: BLE001 - any import-time failure of third-party code, named with its package
        _REGISTRY.clear()
        _REGISTRY.update(before)
        raise ConfigError(f"{plugin.where()} does not import: {type(e).__name__}: {e}",
                          plugin.fix("fix the error (rerun with --debug for the traceback)")) from e
    for name in set(_REGISTRY) - set(before):
        _ORIGIN[name] = plugin


def names() -> list[str]:
    """Every transform name, sorted: built-ins and (unless :func:`scope` says otherwise) plug-ins."""
    _load_plugins()
    if _PLUGINS_ON.get():
        return sorted(_REGISTRY)
    return sorted(n for n in _REGISTRY if n not in _ORIGIN)


def builtin_names() -> list[str]:
    """The transforms that ship with prepline."""
    with scope(plugins=False):
        return names()


def origin(name: str) -> Plugin | None:
    """The plug-in a transform comes from, or None for a built-in."""
    get(name)
    return _ORIGIN.get(name)


def get(name: str) -> type[Transform]:
    """The transform ``name``. A built-in's module (same name) is imported alone when it exists, so a
    run pays for its own transform's imports only (the process start of every stage and worker);
    plug-ins load only for a name that is not a built-in."""
    if name not in _REGISTRY and name.isidentifier() and not name.startswith("_"):
        import prepline.transforms as pkg

        if importlib.util.find_spec(f"{pkg.__name__}.{name}") is not None:
            importlib.import_module(f"{pkg.__name__}.{name}")
    if name not in _REGISTRY:
        _load_builtins()
    if name not in _REGISTRY:
        _load_plugins()
    if name in _REGISTRY and (_PLUGINS_ON.get() or name not in _ORIGIN):
        return _REGISTRY[name]
    raise ConfigError(
        f"unknown transform '{name}'", f"choose one of: {', '.join(names())} (see `prepline list`)"
    ) from None


def build(name: str, params: dict) -> Transform:
    """Construct a transform from its name and loosely typed parameters (validated)."""
    cls = get(name)
    return cls(cls.Config.from_params(params))
