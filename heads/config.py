"""The one configuration system: validated dataclasses, YAML recipes and ``key=value`` overrides.

Every configurable thing in selfspec (a training run, `infer` settings, a script's options) is a
dataclass whose ``__post_init__`` checks its values and raises a one-line ``ValueError``. `load`
layers, in order: the dataclass defaults, an optional YAML file, then dotted ``key=value`` overrides
(``train.lr=1e-3 output_dir=out/x``), through OmegaConf structured configs, so an unknown key or a value
of the wrong type is an error that names the key (and suggests the closest valid one).

It lives in `heads` because `heads` is the bottom layer: `train`, `infer` and `scripts` all import it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import types
import typing
from typing import Any, TypeVar

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

T = TypeVar("T")
__all__ = [
    "MISSING",
    "check_overrides",
    "config_error",
    "key_homes",
    "known_keys",
    "load",
    "option",
    "parse_cli",
    "repeatable",
    "to_yaml",
]


def _blocks(cls: Any) -> dict[str, Any]:
    """``{field name: dataclass}`` for the fields of dataclass ``cls`` that hold a config block (a dataclass,
    or an optional one)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        sub = next((a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)), None)
        if sub is not None:
            out[f.name] = sub
    return out


def known_keys(cls: Any, dotted: str = "") -> list[str]:
    """The field names of the dataclass reached from ``cls`` by the dotted path ``dotted`` ([] if none)."""
    for part in filter(None, dotted.split(".")):
        cls = _blocks(cls).get(part) if dataclasses.is_dataclass(cls) else None
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def key_homes(cls: Any, leaf: str, prefix: str = "") -> list[str]:
    """Dotted paths of the blocks inside dataclass ``cls`` that have a key named ``leaf``."""
    out = []
    for name, sub in _blocks(cls).items():
        if leaf in {f.name for f in dataclasses.fields(sub)}:
            out.append(prefix + name)
        out += key_homes(sub, leaf, f"{prefix}{name}.")
    return out


def config_error(cls: Any, e: Exception) -> ValueError:
    """An OmegaConf error (multi-line, internal) as one line naming the key, with a suggestion: the block
    a misplaced key belongs in, else the closest valid key."""
    key = getattr(e, "full_key", None) or ""
    msg = (getattr(e, "msg", None) or str(e)).strip().splitlines()[0]
    if isinstance(e, (ConfigKeyError, ConfigAttributeError)):
        parent, _, leaf = key.rpartition(".")
        homes = [h for h in key_homes(cls, leaf) if h != parent]
        if homes:
            return ValueError(
                f"unknown config key {key!r}: {leaf!r} is a key of {' and '.join(homes)}, not of "
                f"{parent or 'the top level'} (e.g. {homes[0]}.{leaf}=...)"
            )
        known = known_keys(cls, parent)
        hint = difflib.get_close_matches(leaf, known, n=1)
        suggestion = f"; did you mean {(parent + '.' if parent else '') + hint[0]!r}?" if hint else ""
        where = f" in {parent!r}" if parent else ""
        return ValueError(f"unknown config key {key!r}{suggestion} (valid keys{where}: {', '.join(known)})")
    if isinstance(e, MissingMandatoryValue):
        return ValueError(f"{key} is not set: give it in the recipe or as {key}=...")
    return ValueError(f"bad config value for {key!r}: {msg}" if key else f"bad config: {msg}")


def check_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ValueError(f"overrides must look like key=value (e.g. train.lr=1e-3); got {bad}")


def load(
    cls: type[T],
    path: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    base: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
) -> T:
    """Defaults of ``cls`` <- ``base`` (a dict, optional) <- YAML at ``path`` (optional) <- ``flags``
    (a dict, what `parse_cli` read from ``--flag value``) <- ``key=value`` overrides; returns a validated
    ``cls`` instance.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (one line, naming the key) for an
    unknown key, a value of the wrong type or a value that fails validation.
    """
    layers = [OmegaConf.structured(cls)]
    if base:
        layers.append(OmegaConf.create(base))
    if path is not None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"config file not found: {path!r}")
        try:
            layers.append(OmegaConf.load(path))
        except Exception as e:  # yaml errors come in several types
            raise ValueError(f"{path} is not valid YAML: {e}") from None
    check_overrides(overrides)
    try:
        if flags:
            layers.append(OmegaConf.create(flags))
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_object(OmegaConf.merge(*layers))
    except OmegaConfBaseException as e:
        # A __post_init__ ValueError raised inside OmegaConf arrives wrapped; unwrap it.
        cause = e.__cause__ if isinstance(e.__cause__, (ValueError, FileNotFoundError)) else None
        if cause is not None and not isinstance(cause, OmegaConfBaseException):
            raise cause from None
        raise config_error(cls, e) from None


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _is_list(tp: Any) -> bool:
    return typing.get_origin(tp) in (list, tuple) or any(
        typing.get_origin(a) in (list, tuple) for a in typing.get_args(tp)
    )


def _is_bool(tp: Any) -> bool:
    return tp is bool or (
        typing.get_origin(tp) in (typing.Union, types.UnionType) and bool in typing.get_args(tp)
    )


def _value(text: str) -> Any:
    return None if text.lower() in ("none", "null") else text


def parse_cli(
    cls: type[T], argv: list[str] | None = None, *, prog: str | None = None, description: str | None = None
) -> T:
    """A command line for the config dataclass ``cls`` (the scripts' one way to take options).

    Every top-level field ``some_name`` is a flag ``--some-name VALUE`` (a bool field: ``--some-name`` /
    ``--no-some-name``; a list field: ``--some-name A B`` or the flag repeated); its help text is the
    field's ``metadata["help"]``. ``--config FILE.yaml`` loads a recipe, and positional ``key=value``
    tokens override any (also nested) field. Precedence: defaults <- ``--config`` <- flags <- ``key=value``.
    ``none``/``null`` as a flag value means None. Errors are one line (argparse's, or `load`'s).

    Field metadata may also say ``"positional": True`` (a required positional argument, in field order,
    before the ``key=value`` tokens) and, for a bool, ``"false_flag": "--other"`` (a second flag that sets
    it False, exclusive with the first: ``--private`` / ``--public``).
    """
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=description or (cls.__doc__ or "").split("\n")[0])
    parser.add_argument("--config", default=None, help="a YAML recipe for these options")
    blocks = _blocks(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in blocks]
    for f in fields:  # nested configs are set with key=value
        if f.metadata.get("positional"):
            parser.add_argument(f.name, type=_value, help=f.metadata.get("help"))
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="set any option, e.g. max_new_tokens=64"
    )
    for f in fields:
        if f.metadata.get("positional"):
            continue
        flag, helptext = "--" + f.name.replace("_", "-"), f.metadata.get("help")
        if _is_bool(hints[f.name]):
            group = parser.add_mutually_exclusive_group() if f.metadata.get("false_flag") else parser
            group.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=helptext,
            )
            if f.metadata.get("false_flag"):
                group.add_argument(
                    f.metadata["false_flag"], dest=f.name, action="store_false", default=argparse.SUPPRESS
                )
        elif _is_list(hints[f.name]):
            parser.add_argument(
                flag,
                dest=f.name,
                nargs="+",
                action="extend",
                type=_value,
                default=argparse.SUPPRESS,
                help=helptext,
            )
        else:
            parser.add_argument(flag, dest=f.name, type=_value, default=argparse.SUPPRESS, help=helptext)
    args = vars(parser.parse_args(argv))
    path, overrides = args.pop("config"), args.pop("overrides")
    try:
        return load(cls, path, overrides, flags=args)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))


def option(default: Any = dataclasses.MISSING, *, help: str, **metadata: Any) -> Any:
    """A dataclass field whose flag `parse_cli` documents with ``help``; no ``default``: a required field.
    ``metadata``: more keys of the field's metadata (`parse_cli` reads ``positional`` and ``false_flag``)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def repeatable(*, help: str) -> Any:
    """A list field, empty by default, whose flag takes ``--flag A B`` or the flag repeated (`parse_cli`)."""
    return dataclasses.field(default_factory=list, metadata={"help": help})
