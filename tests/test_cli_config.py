"""`heads.config.parse_cli`: a script's options as a config dataclass (flags, recipe file, key=value)."""

import dataclasses

import pytest

from heads import config


@dataclasses.dataclass
class Inner:
    lr: float = 1e-3

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError("inner.lr must be > 0")


@dataclasses.dataclass
class Opts:
    heads: list[str] = dataclasses.field(default_factory=list, metadata={"help": "heads dirs"})
    max_new_tokens: int = 128
    dtype: str | None = None
    merge: bool = False
    inner: Inner = dataclasses.field(default_factory=Inner)


def test_flags_lists_bools_and_nested_overrides():
    argv = ["--heads", "a=b", "c", "--heads", "d", "--max-new-tokens", "7", "--merge", "inner.lr=0.5"]
    assert config.parse_cli(Opts, argv) == Opts(
        heads=["a=b", "c", "d"], max_new_tokens=7, merge=True, inner=Inner(0.5)
    )
    assert config.parse_cli(Opts, []) == Opts()


def test_recipe_then_flags(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_new_tokens: 9\ndtype: bf16\n")
    o = config.parse_cli(Opts, ["--config", str(recipe), "--dtype", "none"])
    assert o.max_new_tokens == 9 and o.dtype is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-new-tokens", "x"], "could not be converted to Integer"),
        (["inner.lr=-1"], "inner.lr must be > 0"),
        (["inner.lrr=1"], "did you mean 'inner.lr'"),
    ],
)
def test_errors_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        config.parse_cli(Opts, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


@dataclasses.dataclass
class Helped:
    name: str = config.option(help="the name to use")
    tags: list[str] = config.repeatable(help="a tag to add")
    steps: int = config.option(3, help="steps to run")


def test_option_and_repeatable_fields(capsys):
    """`config.option`: a required or defaulted field; `config.repeatable`: a fresh empty list by default,
    extended by each flag; both show their help text."""
    assert config.parse_cli(Helped, ["--name", "x", "--tags", "a", "--tags", "b"]) == Helped(
        "x", ["a", "b"], 3
    )
    assert Helped("y").tags == [] and Helped("y").tags is not Helped("y").tags
    with pytest.raises(TypeError, match="name"):
        Helped()
    with pytest.raises(SystemExit):
        config.parse_cli(Helped, ["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(
        f"{flag} {text}" in shown
        for flag, text in [
            ("NAME", "the name to use"),
            ("TAGS ...]", "a tag to add"),
            ("STEPS", "steps to run"),
        ]
    )


@dataclasses.dataclass
class Small:
    size: int = 1


@dataclasses.dataclass
class Big:
    width: int = 2


@dataclasses.dataclass
class Blocks:
    name: str = dataclasses.field(default=config.MISSING)
    small: Small | None = None
    big: Big | None = None


def test_optional_blocks_misplaced_and_missing_keys():
    """Optional blocks merge from key=value; a key in the wrong block names the block it belongs in; a
    required value that is not set says so, in one line."""
    got = config.load(Blocks, overrides=["name=x", "big.width=3"])
    assert got == Blocks(name="x", small=None, big=Big(3))
    with pytest.raises(
        ValueError, match="^unknown config key 'small.width': 'width' is a key of big, not of small"
    ):
        config.load(Blocks, overrides=["name=x", "small.width=3"])
    with pytest.raises(
        ValueError, match="^unknown config key 'width': 'width' is a key of big, not of the top"
    ):
        config.load(Blocks, overrides=["name=x", "width=3"])
    with pytest.raises(ValueError, match="^name is not set: give it in the recipe or as name=...$"):
        config.load(Blocks)
