"""Typed, validated configuration from YAML and ``key=value`` overrides, built on dataclasses.

Every error is one line naming the key, what was given and what is allowed, e.g.
``config error: train.device = 'gpu' is not allowed; allowed values: auto, cpu, cuda``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A configuration problem, with a one-line message naming the key."""


# Bounds on a YAML document: the deepest config (model.options.<mixer>.<option> in a list) is 5 levels and the
# largest (a suite of dozens of cells) a few thousand nodes; an alias bomb ("billion laughs", 9 levels of 9 aliases)
# expands to 10^9 nodes and deep nesting exhausts Python's recursion limit, so both are refused while composing.
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects a mapping with the same key twice (plain PyYAML silently keeps the last),
    nesting deeper than MAX_YAML_DEPTH and documents whose aliases expand to more than MAX_YAML_NODES nodes."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base class reports it
                    break
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {first.start_mark.line + 1})",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_expanded_size(root: yaml.Node) -> None:
    """ComposerError when ``root`` with every alias expanded has more than MAX_YAML_NODES nodes (counted once per
    distinct node, with memoized subtree sizes, so the count itself stays linear in the document)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise yaml.composer.ComposerError(None, None, "an alias refers to a value that contains it",
                                              node.start_mark)
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"expands to more than {MAX_YAML_NODES:,} values (aliases included)", node.start_mark)
        sizes[id(node)] = total
        return total

    size(root)


def yaml_error_line(e: yaml.YAMLError) -> str:
    """One line saying what is wrong and where (PyYAML's own message spans several lines)."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem:
        mark = e.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{e.problem}{where}"
    return " ".join(str(e).split())


def load_yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML (duplicate keys rejected); ConfigError naming ``where`` otherwise."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"config error: {where} is not valid YAML: {yaml_error_line(e)}") from e


def read_yaml_mapping(path: str | os.PathLike) -> dict:
    """A YAML file whose top level is a mapping (an empty file is ``{}``); one-line ConfigError otherwise: unreadable,
    not UTF-8, not valid YAML, duplicate keys, or a top level that is not a mapping."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"config error: cannot read {path}: {e.strerror}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config error: {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})"
                          ) from e
    data = load_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = f"a {type(data).__name__}" if isinstance(data, (list, tuple)) else _type_name(type(data))
        raise ConfigError(f"config error: {path}: the top level must be a mapping of keys to values, got {kind}")
    return data


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if origin in (list, dict):
        return f"a {origin.__name__}"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    names = {int: "an integer", float: "a number", bool: "true/false", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` converted to the annotation ``tp`` or ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        sections = [arg for arg in typing.get_args(tp) if dataclasses.is_dataclass(arg)]
        if isinstance(value, dict) and len(sections) == 1:  # a section or null: the section's own error names the key
            return from_dict(sections[0], value, key + ".")
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"config error: {key} = {value!r} is not {_type_name(tp)}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"config error: {key} = {value!r} is not allowed; allowed values: "
                              + ", ".join(map(str, allowed)))
        return value
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"config error: {key} = {value!r} is not null")
        return None
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"config error: {key} = {value!r} is not a list")
        return [_coerce(v, item, f"{key}[{i}]") if item is not Any else v for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config error: {key} = {value!r} is not a mapping")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config error: {key} = {value!r} is not true/false")
        return value
    if tp is int:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config error: {key} = {value!r} is not an integer")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config error: {key} = {value!r} is not a number")
        if not math.isfinite(value):
            raise ConfigError(f"config error: {key} = {value!r} is not a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config error: {key} = {value!r} is not a string")
        return value
    return value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """An instance of dataclass ``cls`` from a mapping; unknown keys and wrong types raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {prefix.rstrip('.') or 'the config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            where = f"in '{prefix.rstrip('.')}'" if prefix else "at the top level"
            raise ConfigError(f"config error: unknown key '{prefix}{key}'; allowed keys {where}: "
                              + ", ".join(fields))
    return cls(**{k: _coerce(v, hints[k], prefix + k) for k, v in data.items()})


def parse_overrides(overrides: list[str]) -> dict:
    """``["train.steps=10", "model.layers=[softmax, s4d]"]`` -> nested dict (values parsed as YAML)."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"config error: override {item!r} is not key=value (e.g. train.steps=100)")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config error: override {item!r} conflicts with an earlier one")
        node[parts[-1]] = load_yaml(raw, f"override {item!r}") if raw.strip() else None
    return out


def merge(base: dict, extra: dict) -> dict:
    """Recursive dict merge; ``extra`` wins (mappings merge, other values replace)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def to_dict(obj: Any) -> dict:
    """A dataclass as plain dicts and lists (for YAML/JSON)."""
    return dataclasses.asdict(obj)
