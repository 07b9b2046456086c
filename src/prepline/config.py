"""Frozen, typed, documented transform configs.

A transform's parameters are the fields of one frozen dataclass. Each field is declared with
:func:`param`, which carries its help text and simple constraints; the CLI options, the KFP
component inputs and the parameter tables in the docs are all generated from these fields.
Values are checked when the config is constructed, so a bad parameter fails before any data
is read or any cluster starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from prepline.errors import ConfigError

_SCALARS = (str, int, float, bool)


def param(
    default: Any,
    help: str,
    *,
    choices: tuple | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
) -> Any:
    """Declare a config field with its documentation and constraints."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "min_exclusive": min_exclusive}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=tuple(default): list(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


#: the folder next to a stage's output where sampled removed documents go: ``_removed/<reason>/<file>``
REMOVED_DIR = "_removed"


def removed_sample_param() -> Any:
    """The ``removed_sample`` parameter of a transform that removes documents (the worker writes the sample)."""
    return param(0, f"write up to N removed documents per reason and input file to {REMOVED_DIR}/<reason>/ next to the "
                    "output, to see what was removed (0: none)", min=0)


@dataclass(frozen=True)
class ParamInfo:
    """One parameter as the CLI, the KFP components and the docs see it."""

    name: str
    type: type  # str, int, float, bool or list (of str)
    default: Any
    help: str
    choices: tuple | None

    @property
    def type_name(self) -> str:
        return "list[str]" if self.type is list else self.type.__name__


@dataclass(frozen=True)
class TransformConfig:
    """Base of every transform config. Subclasses add fields with :func:`param`."""

    _hints_cache: ClassVar[dict] = {}

    def __post_init__(self) -> None:
        for info in self.params():
            value = getattr(self, info.name)
            object.__setattr__(self, info.name, _check_value(type(self), info, value))
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; raise :class:`ConfigError` naming the parameter and the fix."""

    @classmethod
    def params(cls) -> list[ParamInfo]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append(
                ParamInfo(
                    name=f.name,
                    type=_base_type(hints[f.name]),
                    default=default,
                    help=f.metadata.get("help", ""),
                    choices=f.metadata.get("choices"),
                )
            )
        return out

    @classmethod
    def from_params(cls, values: dict[str, Any]) -> "TransformConfig":
        """Build a config from loosely typed values (CLI strings, JSON, KFP parameters)."""
        known = cls._known(values)
        kwargs = {k: coerce(known[k], v) for k, v in values.items()}
        return cls(**kwargs)

    @classmethod
    def check_params(cls, values: dict[str, Any]) -> None:
        """Check part of the parameters (names, types, ranges, choices), not how they combine: an
        override merged later into other settings (the whole is checked once merged)."""
        known = cls._known(values)
        for k, v in values.items():
            _check_value(cls, known[k], coerce(known[k], v))

    @classmethod
    def _known(cls, values: dict[str, Any]) -> dict:
        """The parameters by name; an unknown name in ``values`` is an error that lists the valid ones."""
        known = {p.name: p for p in cls.params()}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown parameter(s) {', '.join(unknown)} for {cls.__name__}",
                f"valid parameters: {', '.join(sorted(known))}",
            )
        return known

    def to_dict(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name) for p in self.params()}


def _base_type(hint: Any) -> type:
    origin = typing.get_origin(hint)
    if origin is list:
        return list
    if hint in _SCALARS:
        return hint
    raise TypeError(f"unsupported config field type {hint!r}: use str, int, float, bool or list[str]")


#: ints travel as int64 (Arrow, numpy, KFP): a value beyond it is refused, not wrapped
_INT64 = 2**63


def coerce(info: ParamInfo, value: Any) -> Any:
    """Turn a CLI/KFP value into the field's type, with an error naming the parameter.

    Nothing is rounded or guessed: 2.5 is not an int, NaN and infinities are not numbers here,
    a list must be a JSON list (or one plain value).
    """
    t = info.type
    try:
        if t is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError(value)
        if t is int:
            return _to_int(value)
        if t is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return _finite(float(value))
        if t is list:
            if isinstance(value, (list, tuple)):
                return [_list_item(v) for v in value]
            s = str(value).strip()
            if s.startswith("["):
                parsed = json.loads(s)
                if not isinstance(parsed, list):
                    raise ValueError(value)
                return [_list_item(v) for v in parsed]
            return [s] if s else []
        if isinstance(value, (dict, list)):
            raise ValueError(value)
        return str(value)
    except (ValueError, TypeError, OverflowError, json.JSONDecodeError):
        raise ConfigError(f"parameter {info.name}={value!r} is not a valid {info.type_name}", f"pass {info.name} as {expected(info)}") from None


#: what a value of each type is, in words (a fix says ``pass <name> as <this>``)
_EXPECTED = {str: "a string", int: "a whole number (e.g. 8)", float: "a finite number (e.g. 0.5)", bool: "true or false"}


def expected(info: ParamInfo) -> str:
    """What a value of ``info``'s type looks like, in words with an example (for a fix)."""
    if info.type is list:
        flag = "--" + info.name.replace("_", "-")
        return (f'a list of strings: the option repeated ({flag} a {flag} b) or a JSON list ({flag} \'["a", "b"]\'; '
                f'in --params: {{"{info.name}": ["a", "b"]}})')
    return _EXPECTED[info.type]


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):  # KFP writes ints as floats (3.0): only whole, finite ones
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    s = str(value).strip()
    try:
        return int(s)
    except ValueError:
        f = float(s)  # "3.0" or "1e3"; "2.5", "nan", "1e309" are refused
        if not f.is_integer():
            raise
        return int(f)


def _finite(f: float) -> float:
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f)
    return f


def _list_item(v: Any) -> str:
    if isinstance(v, (dict, list)) or v is None:
        raise ValueError(v)
    return str(v)


def _check_value(cls: type, info: ParamInfo, value: Any) -> Any:
    name = f"{info.name}"
    if info.type is list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"parameter {name} must be a list of strings, got {value!r}", f"pass {name} as {expected(info)}")
        value = tuple(value)  # frozen all the way down
    elif info.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif not isinstance(value, info.type) or (info.type is int and isinstance(value, bool)):
        raise ConfigError(f"parameter {name} must be {info.type_name}, got {value!r}", f"pass {name} as {expected(info)}")
    if info.type is float and not math.isfinite(value):
        raise ConfigError(f"parameter {name}={value} is not a finite number", f"pass a finite number for {name}")
    if info.type is int and not -_INT64 <= value < _INT64:
        raise ConfigError(f"parameter {name}={value} is out of range", f"pass a whole number within ±2**63 for {name}")
    f = {f.name: f for f in dataclasses.fields(cls)}[info.name]
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if info.choices is not None:
        bad = [v for v in (value if info.type is list else (value,)) if v not in info.choices]
        if bad:
            raise ConfigError(
                f"parameter {name}={bad[0]!r} is not one of {', '.join(map(str, info.choices))}",
                f"choose one of: {', '.join(map(str, info.choices))}",
            )
    if lo is not None:
        if (value <= lo) if f.metadata.get("min_exclusive") else (value < lo):
            op = ">" if f.metadata.get("min_exclusive") else ">="
            raise ConfigError(f"parameter {name}={value} must be {op} {lo}", f"pass {name} {op} {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"parameter {name}={value} must be <= {hi}", f"pass {name} <= {hi}")
    return value
