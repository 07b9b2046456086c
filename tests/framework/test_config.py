from dataclasses import FrozenInstanceError, dataclass

import pytest

from prepline import registry
from prepline.config import TransformConfig, param
from prepline.errors import ConfigError


@dataclass(frozen=True)
class DemoConfig(TransformConfig):
    name: str = param("contents", "a column")
    shards: int = param(4, "shards", min=1, max=10)
    ratio: float = param(0.5, "a ratio", min=0.0, min_exclusive=True, max=1.0)
    flag: bool = param(False, "a flag")
    items: list[str] = param(["a"], "items", choices=("a", "b"))
    mode: str = param("x", "mode", choices=("x", "y"))


def test_defaults_and_frozen():
    c = DemoConfig()
    assert c.items == ("a",) and c.ratio == 0.5
    with pytest.raises(FrozenInstanceError):
        c.shards = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "values, match",
    [
        ({"shards": 0}, "shards=0 must be >= 1"),
        ({"shards": 11}, "shards=11 must be <= 10"),
        ({"ratio": 0}, "ratio=0.0 must be > 0"),
        ({"mode": "z"}, "mode='z' is not one of x, y"),
        ({"items": ["a", "c"]}, "items='c' is not one of"),
        ({"shards": "many"}, "shards='many' is not a valid int"),
        ({"flag": "perhaps"}, "flag='perhaps' is not a valid bool"),
        ({"nope": 1}, "unknown parameter"),
    ],
)
def test_bad_values_name_the_parameter(values, match):
    with pytest.raises(ConfigError, match=match):
        DemoConfig.from_params(values)


def test_coercion_from_strings_and_json():
    c = DemoConfig.from_params({"shards": "7", "ratio": "1", "flag": "true", "items": '["a","b"]', "mode": "y"})
    assert (c.shards, c.ratio, c.flag, c.items, c.mode) == (7, 1.0, True, ("a", "b"), "y")
    assert DemoConfig.from_params({"shards": 3.0}).shards == 3  # KFP writes ints as floats
    assert DemoConfig.from_params({"items": "b"}).items == ("b",)


def test_direct_construction_is_checked_too():
    with pytest.raises(ConfigError):
        DemoConfig(shards=True)  # bool is not an int here


def test_every_registered_config_documents_every_parameter():
    for name in registry.names():
        cls = registry.get(name)
        assert cls.summary, name
        for p in cls.Config.params():
            assert p.help and not p.help.endswith("."), (name, p.name)
        try:
            cls(cls.Config())  # defaults are valid ...
        except ConfigError as e:  # ... or the error says what to pass
            assert e.fix, name


def test_unknown_transform():
    with pytest.raises(ConfigError, match="unknown transform 'nope'"):
        registry.get("nope")


@pytest.mark.parametrize("values, match", [
    ({"ratio": float("nan")}, "ratio=nan is not a valid float"),
    ({"ratio": "nan"}, "is not a valid float"),
    ({"ratio": "inf"}, "is not a valid float"),
    ({"shards": 2.5}, "shards=2.5 is not a valid int"),
    ({"shards": "2.5"}, "is not a valid int"),
    ({"shards": float("inf")}, "is not a valid int"),
    ({"shards": 10**30}, "is out of range"),
    ({"items": [["a"]]}, "is not a valid list"),
    ({"mode": {"x": 1}}, "is not a valid str"),
])
def test_nothing_is_rounded_or_guessed(values, match):
    with pytest.raises(ConfigError, match=match) as e:
        DemoConfig.from_params(values)
    assert e.value.fix


def test_whole_floats_and_exponents_are_ints():
    assert DemoConfig.from_params({"shards": "1e1"}).shards == 10
    assert DemoConfig.from_params({"shards": 4.0}).shards == 4


def test_direct_construction_refuses_nan():
    with pytest.raises(ConfigError, match="not a finite number"):
        DemoConfig(ratio=float("nan"))
