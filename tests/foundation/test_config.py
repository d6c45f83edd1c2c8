"""align.config: strict typed loading, typed overrides, includes, and byte-stable resolved TOML."""

import tomllib
from dataclasses import dataclass, field
from typing import Literal

import pytest

from align.config import (ConfigError, config_digest, from_dict, load_cli_config, load_config, to_toml,
                          write_resolved_config)
from align.profile import CommonConfig


@dataclass(frozen=True)
class Optim:
    lr: float = 1e-4
    betas: tuple[float, ...] = (0.9, 0.95)
    name: Literal["adamw", "sgd"] = "adamw"


@dataclass(frozen=True)
class Train:
    steps: int  # required
    tag: str = "run"
    compile: bool = False
    clip: float | None = None
    weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Stage(CommonConfig):
    train: Train
    optim: Optim = field(default_factory=Optim)


def _write(path, text):
    path.write_text(text)
    return path


def test_typo_names_file_table_key_and_allowed_keys(tmp_path):
    f = _write(tmp_path / "s.toml", "[train]\nsteps = 3\nstpes = 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, Stage)
    msg = str(err.value)
    assert str(f) in msg and "[train]" in msg and "'stpes'" in msg and "allowed keys: clip, compile, steps" in msg


@pytest.mark.parametrize("text, expected", [
    ("[optim]\nlr = 1.0\n", "missing required key 'train' (Train)"),  # the whole table is missing
    ("[train]\ntag = 'x'\n", "missing required key 'steps' (int)"),
    ("[train]\nsteps = '3'\n", "train.steps: expected int, got str '3'"),
    ("[train]\nsteps = true\n", "train.steps: expected int, got bool"),
    ("[train]\nsteps = 1\ncompile = 1\n", "train.compile: expected bool"),
    ("[train]\nsteps = 1\n[optim]\nname = 'adam'\n", "optim.name: expected one of 'adamw', 'sgd'"),
    ("[train]\nsteps = 1\n[optim]\nbetas = [0.9, 'x']\n", "optim.betas[1]: expected float"),
    ("[train]\nsteps = 1\n[run]\nworld_size = 0\n", "[run] world_size must be >= 1"),
    ("train = 3\n", "[train] expected a table, got int"),
    ("[train\nsteps = 1\n", "malformed TOML: Expected ']' at the end of a table declaration (at line 1, column 7)"),
])
def test_bad_files_name_what_is_wrong(tmp_path, text, expected):
    f = _write(tmp_path / "s.toml", text)
    with pytest.raises(ConfigError) as err:
        load_config(f, Stage)
    assert expected in str(err.value) and str(f) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml", Stage)


def test_overrides_are_typed_by_the_field(tmp_path):
    f = _write(tmp_path / "s.toml", "[train]\nsteps = 3\n")
    cfg = load_config(f, Stage, ["train.steps=10", "optim.lr=3e-4", "train.tag=baseline", "train.compile=true",
                                 "optim.betas=[0.8, 0.9]", "optim.name=sgd", "train.clip=1", "run.seed=7",
                                 "train.weights.a=2"])
    assert cfg.train.steps == 10 and cfg.optim.lr == 3e-4 and cfg.train.tag == "baseline"
    assert cfg.train.compile is True and cfg.optim.betas == (0.8, 0.9) and cfg.optim.name == "sgd"
    assert cfg.train.clip == 1.0 and isinstance(cfg.train.clip, float) and cfg.run.seed == 7
    assert cfg.train.weights == {"a": 2.0}
    with pytest.raises(ConfigError, match="override 'train.steps=ten': value 'ten' is not a valid TOML value for type int"):
        load_config(f, Stage, ["train.steps=ten"])
    with pytest.raises(ConfigError, match="train.steps: expected int, got str 'ten'"):
        load_config(f, Stage, ["train.steps='ten'"])
    with pytest.raises(ConfigError, match=r"\[train\] unknown key 'step' in override; allowed: "):
        load_config(f, Stage, ["train.step=1"])
    with pytest.raises(ConfigError, match="expected table.key=value"):
        load_config(f, Stage, ["train.steps"])


def test_include_merges_under_the_files_own_values(tmp_path):
    _write(tmp_path / "common.toml", "[run]\nseed = 5\nworld_size = 2\n[train]\nsteps = 1\ntag = 'base'\n")
    f = _write(tmp_path / "s.toml", "include = 'common.toml'\n[train]\nsteps = 9\n")
    cfg = load_config(f, Stage)
    assert (cfg.run.seed, cfg.run.world_size, cfg.train.steps, cfg.train.tag) == (5, 2, 9, "base")
    _write(tmp_path / "a.toml", "include = 'b.toml'\n")
    _write(tmp_path / "b.toml", "include = 'a.toml'\n")
    with pytest.raises(ConfigError, match="include cycle"):
        load_config(tmp_path / "a.toml", Stage)


def test_resolved_toml_is_byte_stable_and_round_trips(tmp_path):
    a = _write(tmp_path / "a.toml", "[optim]\nlr = 0.0003\nname = 'sgd'\n[train]\nsteps = 3\nweights = {y = 1, x = 2}\n")
    b = _write(tmp_path / "b.toml", "[train]\nweights = {y = 1.0, x = 2.0}\nsteps = 3\n\n[optim]\nname = \"sgd\"\n"
                                    "lr = 3e-4  # same value\n")
    ca, cb = load_config(a, Stage), load_config(b, Stage)
    assert to_toml(ca).encode() == to_toml(cb).encode() and config_digest(ca) == config_digest(cb)
    text = to_toml(ca)
    assert from_dict(Stage, tomllib.loads(text)) == ca and to_toml(from_dict(Stage, tomllib.loads(text))) == text
    assert "clip" not in text  # None is written by omission
    assert config_digest(load_config(a, Stage, ["optim.lr=0.0004"])) != config_digest(ca)
    path = write_resolved_config(ca, tmp_path / "run")
    assert path.read_text() == text


def test_cli(tmp_path):
    f = _write(tmp_path / "s.toml", "[train]\nsteps = 3\n")
    assert load_cli_config(Stage, ["--config", str(f), "train.steps=4"]).train.steps == 4
