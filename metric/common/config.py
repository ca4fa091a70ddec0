"""Configuration as dataclasses loaded from YAML with `_base_` inheritance and `key=value` overrides.

A YAML file may name `_base_: other.yaml` (relative to itself, or a list of files); its keys are merged
recursively over the base. Overrides use dotted keys (`xe.max_steps=100`) and YAML-typed values.

Values are read with the YAML 1.2 core schema (`1e-6` is a float, `yes`/`no`/`on`/`off` are strings) and
then typed and validated against the dataclass with pydantic (a `TypeAdapter`-style model over the plain
dataclass): every value is coerced to its field's type or refused with one `InputError` naming the dotted
key, the value and the expected type. Range constraints are written as `typing.Annotated` metadata
(`PositiveInt`, `PositiveFloat`, ... below), and a config class may define `validate(self) -> None` for
checks that span fields; `from_dict` runs it on every section. The rules are in docs/config.md.

A config class may list renamed keys in a class-level `DEPRECATED_ALIASES = {"old": "new"}` mapping: the old
key still loads (from YAML, overrides or `from_dict`) as the new one, with a DeprecationWarning and a logged
warning naming the file, the key, its new name and the release that drops it (the class's `ALIASES_REMOVED_IN`,
default `DEFAULT_ALIASES_REMOVED_IN`); giving both names is an InputError.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic
import yaml
from annotated_types import Ge, Gt, Interval, Le, Lt

from pacs.metric.common.config_files import SUFFIXES, resolve_config
from pacs.metric.common.errors import InputError
from pacs.metric.common.file_kinds import refuse_special
from pacs.metric.common.suggest import known_hint

T = TypeVar("T")
logger = logging.getLogger(__name__)

PositiveInt = Annotated[int, Ge(1)]
"""An int >= 1 (batch sizes, step counts, k, intervals used with `%`)."""
NonNegativeInt = Annotated[int, Ge(0)]
"""An int >= 0 (counts and limits where 0 means 'none' or 'all')."""
PositiveFloat = Annotated[float, Gt(0)]
"""A float > 0 (learning rates)."""
NonNegativeFloat = Annotated[float, Ge(0)]
"""A float >= 0 (weights, decays, clipping where 0 means 'off')."""
Fraction = Annotated[float, Ge(0), Lt(1)]
"""A float in [0, 1) (dropout)."""
Probability = Annotated[float, Ge(0), Le(1)]
"""A float in [0, 1]."""
Seed = Annotated[int, Interval(ge=0, le=2**32 - 1)]
"""A random seed: an int in [0, 2**32 - 1] (numpy generators refuse negative seeds)."""

# Upper bounds shared by several configs (issue 31): every size, count and step key also has an upper bound, written
# as `Annotated[..., Le(bound)]` next to its lower one, so a typo is refused at load instead of ending in the
# out-of-memory killer or running for ever (the bounds and their reasons: docs/config.md "Upper bounds").
MAX_THREADS = 256
"""Torch threads per process (far above any core count; 100000 makes torch fail with a MemoryError)."""
MAX_STEPS = 1_000_000
"""Optimizer steps, warm-up lengths and every-N cadences of the recipe trainers (COCO XE: 20000)."""
MAX_BATCH = 65_536
"""Global batch sizes of the recipe trainers (pairs or captions per optimizer step; COCO XE: 1024)."""
MAX_MICRO_BATCH = 4096
"""What one process encodes at once (the memory-bound part of a batch; COCO XE: 128)."""
MAX_BEAM = 64
"""Beam sizes and samples per image."""
MAX_RESAMPLES = 100_000
"""Bootstrap resamples."""
MAX_IMAGES = 10_000_000
"""Image and pair counts of real data sets (COCO: 123287 images)."""
MAX_LENGTH = 512
"""Caption lengths in tokens."""
MIN_TEMPERATURE = 1e-4
"""The lowest sampling temperature: log-probabilities divided by it stay finite in float32 (and in bf16), while
1e-300 is 0 there (a division by zero at the first sampling step); below it sampling is greedy in all but name."""
Temperature = Annotated[float, Ge(MIN_TEMPERATURE)]
"""A sampling temperature: a float >= MIN_TEMPERATURE."""

# Bounds of the YAML a config is read from (issue 41): a recipe is a few hundred values, so these only refuse bombs.
MAX_YAML_DEPTH = 100
"""Nesting levels of one YAML document (100,000 would end in a RecursionError)."""
MAX_YAML_VALUES = 100_000
"""Values one YAML document holds once its aliases are expanded (a 1 KB 'billion laughs' file expands to 10**10)."""
MAX_YAML_BYTES = 10 * 1024 * 1024
"""Size of one YAML config file."""
MAX_BASE_FILES = 100
"""`_base_` files one config loads, counted over the whole chain (a base named twice counts twice)."""

_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_RE = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_FLOAT_RE = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_CORE_TAGS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class YAMLBoundError(yaml.YAMLError):
    """A YAML document nested too deeply, expanding to too many values, or with an alias inside its own anchor."""


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema for bool, int and float scalars, and bounded documents.

    While composing, every node's size once its aliases are expanded is counted (each node once, so counting costs
    what the file holds, not what it expands to) and its depth checked: a 'billion laughs' document or one nested
    `MAX_YAML_DEPTH` levels deep is a `YAMLBoundError` at once, before anything walks it as a tree.
    """

    def __init__(self, stream: Any) -> None:
        """Start a loader over `stream` with no node composed yet."""
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> how many values it expands to (the nodes live as long)

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node as SafeLoader does, refusing it when too deep or too large once expanded."""
        mark = self.peek_event().start_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        if self._depth >= MAX_YAML_DEPTH:
            raise YAMLBoundError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep")
        alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if alias:
            if id(node) not in self._sizes:
                raise YAMLBoundError(f"{where}: an alias refers to the node that contains it (a recursive anchor)")
            return node
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._sizes[id(child)] for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._sizes[id(key)] + self._sizes[id(value)] for key, value in node.value)
        else:
            size = 1
        if size > MAX_YAML_VALUES:
            raise YAMLBoundError(f"{where}: its aliases expand to more than {MAX_YAML_VALUES} values (a 'billion "
                                 "laughs' document?): write the values out, or use fewer aliases")
        self._sizes[id(node)] = size
        return node


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _CORE_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_RE, list("tTfF"))
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_RE, list("-+0123456789"))
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+.0123456789"))


class _ConfigDumper(yaml.SafeDumper):
    """SafeDumper that also quotes strings the YAML 1.2 core schema would read as numbers."""


_ConfigDumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+.0123456789"))


def yaml_value(text: str) -> Any:
    """Parse one YAML value with the config schema (YAML 1.2 core: `1e-6` is a float, `no` a string).

    A document nested deeper than `MAX_YAML_DEPTH` or expanding to more than `MAX_YAML_VALUES` values is a
    `YAMLBoundError`.
    """
    return yaml.load(text, Loader=_ConfigLoader)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """The one-line reason of a YAML error, with its line and column but never the text of the line."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    mark = error.problem_mark or error.context_mark
    parts = [part for part in (error.context, error.problem) if part]
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return ": ".join(" ".join(part.split()) for part in parts) + where


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _base_names(bases: Any, path: Path) -> list[str]:
    """The `_base_` value of `path` as a list of file names; InputError naming `_base_` when it is not one."""
    if bases is None or bases == "" or bases == []:
        return []
    names = [bases] if isinstance(bases, str) else bases
    if not isinstance(names, list) or not all(isinstance(name, str) and name.strip() for name in names):
        raise InputError(f"{path}: _base_ must be a YAML file name or a list of them, got {_short(bases)}")
    return names


def _read_config_text(path: Path, base_of: Path | None) -> str:
    """The text of the config file `path` (a `_base_` of `base_of`): a regular, UTF-8 YAML file of bounded size."""
    what = f"{base_of}: _base_" if base_of is not None else "config file"
    refuse_special(path, what)
    if not path.is_file():
        raise InputError(f"config file not found: {path}" if base_of is None else
                         f"{base_of}: _base_ file not found: {path}")
    if base_of is not None and path.suffix.lower() not in SUFFIXES:  # after links: /etc/shadow is not a config
        raise InputError(f"{what} {path} is not a YAML file (a _base_ names a {' or '.join(SUFFIXES)} file)")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise InputError(f"{path}: {size} bytes: a config file holds at most {MAX_YAML_BYTES} bytes")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start} cannot be decoded): save the config as "
                         "UTF-8") from None


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` with `update` merged in recursively (dicts merge, everything else replaces; an empty dict
    replaces too: `{}` is how a file or an override clears a mapping, e.g. `features.source.random_config={}`)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and value and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | os.PathLike, _seen: tuple[Path, ...] = (),
              normalize: Callable[[dict[str, Any], str], dict[str, Any]] | None = None,
              _loaded: list[int] | None = None) -> dict[str, Any]:
    """Load a YAML config, resolving `_base_` files recursively (cycles are an error).

    `path` may also name a packaged config (`demo_smoke`; see `pacs.metric.common.config_files.resolve_config`).
    `normalize(data, file)` rewrites each file's own keys before the merge (`load_config`: deprecated names).
    Every file is a regular UTF-8 file of at most `MAX_YAML_BYTES` bytes whose YAML is bounded (`yaml_value`);
    a `_base_` names `.yaml` / `.yml` files (links followed), at most `MAX_BASE_FILES` over the chain. Errors
    name the file, the line and the column, never a line of its text.
    """
    if not _seen:
        path = resolve_config(path)
    loaded = _loaded if _loaded is not None else [0]
    path = Path(path).resolve()
    if path in _seen:
        raise InputError(f"{path}: _base_ cycle through {' -> '.join(map(str, _seen))}")
    text = _read_config_text(path, _seen[-1] if _seen else None)
    try:
        data = yaml_value(text) or {}
    except YAMLBoundError as error:
        raise InputError(f"{path}: refused: {error}") from None
    except yaml.YAMLError as error:
        raise InputError(f"{path}: invalid YAML: {_yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config must be a mapping at the top level")
    bases = _base_names(data.pop("_base_", None), path)
    merged: dict[str, Any] = {}
    for base in bases:
        loaded[0] += 1
        if loaded[0] > MAX_BASE_FILES:
            raise InputError(f"{path}: _base_: more than {MAX_BASE_FILES} base files over the chain (a base "
                             "named many times at every level?)")
        merged = deep_merge(merged, load_yaml(path.parent / base, _seen + (path,), normalize, loaded))
    return deep_merge(merged, normalize(data, str(path)) if normalize else data)


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Turn `a.b=value` strings into a nested dict; values are parsed as YAML scalars/lists (1.2 core)."""
    result: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise InputError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml_value(raw) if raw != "" else ""
        except YAMLBoundError as error:
            raise InputError(f"override {key.strip()}=...: refused: {error}") from None
        except yaml.YAMLError:
            value = raw
        node = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"override {item!r}: {part!r} was already given a value")
            node = child
        node[parts[-1]] = value
    return result


def _strip(tp: Any) -> tuple[Any, bool, tuple[Any, ...]]:
    """(the type without Annotated/Optional, whether None is allowed, the Annotated metadata)."""
    metadata: tuple[Any, ...] = ()
    optional = False
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            metadata += tuple(tp.__metadata__)
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union or origin is types.UnionType:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(tp))
            if len(args) != 1:
                return tp, optional, metadata
            tp = args[0]
        else:
            return tp, optional, metadata


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _field_default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return None if field.default is dataclasses.MISSING else field.default


DEFAULT_ALIASES_REMOVED_IN = "0.8"
"""The release that drops a class's `DEPRECATED_ALIASES` unless it names another (`ALIASES_REMOVED_IN`)."""


def _rename_aliases(cls: type, data: Mapping[str, Any], where: str, prefix: str) -> Mapping[str, Any]:
    """Rename the deprecated keys of `cls.DEPRECATED_ALIASES` in one section (warning once per key; the removal
    release the warning names is `cls.ALIASES_REMOVED_IN`, default `DEFAULT_ALIASES_REMOVED_IN`)."""
    aliases: Mapping[str, str] = getattr(cls, "DEPRECATED_ALIASES", {})
    if not any(old in data for old in aliases):
        return data
    renamed = dict(data)
    for old, new in aliases.items():
        if old not in renamed:
            continue
        if new in renamed:
            raise InputError(f"{where}: {prefix}{old} and {prefix}{new} are the same setting ({prefix}{old} is "
                             f"its deprecated name): give only {prefix}{new}")
        removed = getattr(cls, "ALIASES_REMOVED_IN", DEFAULT_ALIASES_REMOVED_IN)
        message = f"{where}: {prefix}{old} is deprecated (removed in pacs {removed}): use {prefix}{new}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        logger.warning("%s", message)
        renamed[new] = renamed.pop(old)
    return renamed


def rename_deprecated(cls: type, data: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """`data` with the deprecated keys of `cls` and of its dataclass sections renamed (at any depth)."""
    data = _rename_aliases(cls, data, where, prefix)
    hints = _hints(cls)
    result = dict(data)
    for key, value in data.items():
        field_type = _strip(hints[key])[0] if key in hints else None
        if isinstance(value, Mapping) and dataclasses.is_dataclass(field_type):
            result[key] = rename_deprecated(field_type, value, where, f"{prefix}{key}.")
    return result


def _prepare(cls: type, data: Mapping[str, Any], where: str, prefix: str) -> dict[str, Any]:
    """Check keys, merge nested sections over their defaults and apply the loader's own rules."""
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: {prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    data = _rename_aliases(cls, data, where, prefix)
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    prepared: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            place = f"{where}: {prefix.rstrip('.')}" if prefix else where
            raise InputError(f"{place}: unknown key {key!r} {known_hint(key, sorted(fields))}")
        dotted = prefix + key
        field_type, optional, _ = _strip(hints[key])
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if dataclasses.is_dataclass(field_type) and isinstance(value, Mapping):
            default = _field_default(fields[key])
            base = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else {}
            value = _rename_aliases(field_type, value, where, dotted + ".")  # before the default's new names join
            value = _prepare(field_type, deep_merge(base, value), where, dotted + ".")
        elif optional and value == "" and field_type is not str:
            value = None
        elif field_type in (int, float) and isinstance(value, bool):
            raise InputError(f"{where}: {dotted}={value!r}: expected {_describe(hints[key])}, got a bool")
        prepared[key] = value
    return prepared


def _describe(tp: Any) -> str:
    """A short human name for a field type ('int >= 1', 'float or null', 'list of str', ...)."""
    base, optional, metadata = _strip(tp)
    origin = typing.get_origin(base)
    if origin in (list, tuple, set, Sequence):
        args = typing.get_args(base)
        name = f"list of {_describe(args[0])}" if args else "list"
    elif origin in (dict, Mapping):
        name = "mapping"
    elif dataclasses.is_dataclass(base):
        name = "section (a mapping of keys)"
    elif base is Any:
        name = "any value"
    else:
        name = getattr(base, "__name__", str(base))
    bounds = [f"{symbol} {getattr(item, attribute)}" for item in metadata
              for attribute, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if getattr(item, attribute, None) is not None]
    if bounds:
        name += " " + " and ".join(bounds)
    return f"{name} or null" if optional else name


def describe_type(tp: Any) -> str:
    """A short human name of an annotated type with its bounds, as config errors write it ('int >= 1 and <= 64')."""
    return _describe(tp)


@functools.cache
def _adapter(tp: Any) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(tp)


def fits_type(tp: Any, value: Any) -> bool:
    """Whether `value` is of the annotated type `tp` and within its bounds (no coercion: '5' is not an int)."""
    if isinstance(value, bool) and _strip(tp)[0] in (int, float):
        return False
    try:
        _adapter(tp).validate_python(value, strict=True)
    except pydantic.ValidationError:
        return False
    return True


def _type_at(cls: type, loc: Sequence[Any]) -> Any:
    """The annotated type of the value at pydantic location `loc` (None when it cannot be followed)."""
    tp: Any = cls
    for part in loc:
        base = _strip(tp)[0]
        if dataclasses.is_dataclass(base) and isinstance(part, str):
            tp = _hints(base).get(part)
        elif typing.get_origin(base) in (list, tuple, set) and isinstance(part, int):
            args = typing.get_args(base)
            tp = args[0] if args else None
        elif typing.get_origin(base) in (dict, Mapping):
            args = typing.get_args(base)
            tp = args[1] if len(args) == 2 else None
        else:
            return None
        if tp is None:
            return None
    return tp


def _dotted(loc: Sequence[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@functools.cache
def _validator(cls: type) -> type[pydantic.BaseModel]:
    """A pydantic model with one field `root` of dataclass type `cls` (carries the loader's settings)."""
    settings = pydantic.ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False,
                                   arbitrary_types_allowed=True)
    return pydantic.create_model(f"{cls.__name__}Loader", __config__=settings, root=(cls, ...))


def _typed(cls: type[T], data: dict[str, Any], where: str) -> T:
    """Coerce `data` into `cls` with pydantic; one InputError lists every value that does not fit."""
    try:
        return _validator(cls)(root=data).root  # type: ignore[attr-defined]
    except pydantic.ValidationError as error:
        problems = []
        for item in error.errors(include_url=False):
            loc = tuple(item["loc"][1:])
            expected = _type_at(cls, loc)
            expectation = f"expected {_describe(expected)}" if expected is not None else "invalid"
            problems.append(f"{_dotted(loc) or 'config'}={item['input']!r}: {expectation} ({item['msg']})")
        raise InputError(f"{where}: " + "; ".join(problems)) from None


def _run_checks(config: Any, where: str, section: str = "") -> None:
    """Call `validate()` of every dataclass section (innermost first), naming the section in errors."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _run_checks(value, where, f"{section}{field.name}.")
    check = getattr(config, "validate", None)
    if callable(check):
        try:
            check()
        except InputError as error:
            place = f"{where}: {section.rstrip('.')}" if section else where
            raise InputError(f"{place}: {error}") from None


def from_dict(cls: type[T], data: Mapping[str, Any] | None, where: str = "config") -> T:
    """Build dataclass `cls` from a mapping, typed and validated; unknown keys and bad values are InputErrors."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    config = _typed(cls, _prepare(cls, data or {}, where, ""), where)
    _run_checks(config, where)
    return config


def check_folder_name(key: str, name: str, parent: str) -> None:
    """InputError unless `name` is one plain folder name, which `parent / name` keeps inside `parent`."""
    if (not isinstance(name, str) or not name.strip() or name in (".", "..") or "/" in name or "\\" in name
            or "\0" in name or os.path.isabs(name)):
        raise InputError(f"{key} must be a folder name inside {parent}, got {name!r}")


def check_batch_split(key: str, batch: int, micro: int, processes: int = 1) -> int:
    """Micro-batches per process per step; InputError unless `batch` is a multiple of `micro` × `processes`."""
    where = f"{key}: " if key else ""
    if batch < 1 or micro < 1 or processes < 1:
        raise InputError(f"{where}batch_size ({batch}), micro_batch_size ({micro}) and the process count "
                         f"({processes}) must all be >= 1")
    if batch % (micro * processes):
        times = f" × processes ({processes}) = {micro * processes}" if processes != 1 else ""
        raise InputError(f"{where}batch_size={batch} must be a multiple of micro_batch_size ({micro}){times}")
    return batch // (micro * processes)


_ENV_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(data: Any, where: str = "config", key: str = "") -> Any:
    """`data` with `${NAME}` in every string replaced by the environment variable NAME (`$$` is a literal `$`).

    An unset (or empty) variable is one InputError naming the dotted key and the variable, so a recipe that reads
    `${PACS_SHARED}/data/flickr8k` says what to export instead of looking for a folder named `${PACS_SHARED}`.
    """
    if isinstance(data, Mapping):
        return {k: expand_env(v, where, f"{key}.{k}" if key else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, where, f"{key}[{i}]") for i, v in enumerate(data)]
    if not isinstance(data, str) or "$" not in data:
        return data

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        value = os.environ.get(name, "")
        if not value:
            raise InputError(f"{where}: {key or 'config'}={data!r}: the environment variable {name} is not set "
                             f"(export {name}=..., or set {key or 'the key'} to a path)")
        return value

    return _ENV_RE.sub(substitute, data)


def config_data(cls: type, path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The mapping `load_config` types: the YAML file(s) merged with the overrides, deprecated keys of `cls` renamed,
    `${NAME}` environment variables expanded (`expand_env`, after the merge: an override may replace such a value).

    Each file is renamed on its own before the `_base_` merge, so a file in the old names still derives from a
    base in the new ones.
    """
    def rename(data: dict[str, Any], source: str) -> dict[str, Any]:
        return rename_deprecated(cls, data, source)

    data = load_yaml(path, normalize=rename) if path else {}
    merged = deep_merge(data, rename(parse_overrides(overrides), "override"))
    return expand_env(merged, str(path) if path else "config")


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> T:
    """Load dataclass `cls` from an optional YAML file plus `key=value` overrides (typed and validated)."""
    data = config_data(cls, path, overrides)
    where = str(path) if path else "config"
    if path and overrides:
        where += " (with overrides)"
    return from_dict(cls, data, where)


def to_dict(config: Any) -> dict[str, Any]:
    """Return a dataclass config as a plain dict (for provenance and saving)."""
    return dataclasses.asdict(config)


def dump_yaml(config: Any, path: str | os.PathLike) -> None:
    """Write a dataclass config as YAML atomically (strings that look like numbers are quoted)."""
    from pacs.metric.common.io import write_text_atomic

    write_text_atomic(path, yaml.dump(to_dict(config), Dumper=_ConfigDumper, sort_keys=False))
