"""Command lines and the docs' flag tables, generated from the fields of configuration classes.

A configuration class (a dataclass) turns a field into a command-line flag by giving it
``metadata=flag(...)``: the flag's name (vLLM's, unless said otherwise), type, choices, default
and help all come from the field (its annotation, its default and the docstring under it), as
vLLM's ``EngineArgs.add_cli_args`` reads its own fields. So a knob is written once: adding a
``vllm serve`` flag that sets a configuration field is adding that one field, and ``--help``,
the value the command hands the configuration and the flag tables in docs/ all follow.

This module imports nothing heavy and no other mmfront module, so every command line may use it
before it imports what the command runs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mmfront.errors import ConfigError

_FIELD_DEFAULT: Any = object()


@dataclass(frozen=True)
class Flag:
    """How a configuration field is spelled on a command line; everything left out is read from
    the field."""

    name: str | None = None
    """The option (``--mm-processor-cache-gb``); ``None``: the field's name with dashes."""
    aliases: tuple[str, ...] = ()
    """vLLM's short forms (``-dp``)."""
    vllm: bool = True
    """Whether ``vllm serve`` takes the same flag with the same meaning (else it is mmfront's own)."""
    parse: Callable[[str], Any] | None = None
    """Reads one value from the text (argparse's ``type``); ``None``: from the field's annotation."""
    collect: Callable[[Any], Any] | None = None
    """Turns what was parsed into the field's value (e.g. several words into one key)."""
    metavar: str | None = None
    default: Any = _FIELD_DEFAULT
    """The command's default where it differs from the field's (``mmfront serve`` runs lanes)."""
    shown_default: str | None = None
    """The default as ``--help`` and the docs write it, where its value reads badly."""
    negation: str | None = None
    """The flag that sets a boolean field to False; ``None``: vLLM's counterpart of the name
    (``--enable-x``/``--disable-x``, ``--x``/``--no-x``), for a flag ``vllm serve`` also takes."""
    several: bool = False
    """The flag takes several values at once (``--served-model-name a b``)."""
    repeat: bool = False
    """The flag may be given several times, once per item (argparse's ``append``)."""
    positional: bool = False
    example: str | None = None
    """An example value, named in the error for a value that does not parse (JSON objects)."""


def flag(**spec: Any) -> dict[str, Flag]:
    """Field metadata declaring a command-line flag: ``field(default=..., metadata=flag(...))``,
    with :class:`Flag`'s fields as keywords."""
    return {"flag": Flag(**spec)}


@dataclass(frozen=True)
class Option:
    """One field's flag, resolved: what argparse needs and what the docs show."""

    field: dataclasses.Field[Any]
    flag: Flag
    help: str
    default: Any
    choices: tuple[Any, ...] | None
    parse: Callable[[str], Any] | None
    collect: Callable[[Any], Any] | None
    is_bool: bool
    many: bool

    @property
    def dest(self) -> str:
        return self.field.name

    @property
    def name(self) -> str:
        if self.flag.positional:
            return self.flag.metavar or self.field.name.upper()
        return self.flag.name or "--" + self.field.name.replace("_", "-")

    @property
    def negation(self) -> str | None:
        """The flag that turns a boolean off, as vLLM's ``EnableDisableAction`` names it."""
        if not self.is_bool:
            return None
        if self.flag.negation is not None or not self.flag.vllm:
            return self.flag.negation
        return counterpart(self.name)

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling: the flag, its short forms, its negation."""
        return (self.name, *self.flag.aliases, *((self.negation,) if self.negation else ()))

    @property
    def shown_default(self) -> str | None:
        """The default as a reader sees it, or ``None`` where there is nothing to show."""
        if self.flag.shown_default is not None:
            return self.flag.shown_default
        value = self.default
        if value is None or (isinstance(value, (tuple, list, Mapping)) and not value):
            return None
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


@functools.cache
def options(cls: type) -> tuple[Option, ...]:
    """The flags ``cls``'s fields declare, in field order."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("flag")
        if spec is None:
            continue
        annotation = _without_none(hints[f.name])
        default = spec.default if spec.default is not _FIELD_DEFAULT else _field_default(f)
        choices = tuple(typing.get_args(annotation)) if typing.get_origin(annotation) is Literal else None
        is_bool = annotation is bool
        # a list-typed field with its own parser reads the whole list from one value (a JSON list)
        many = (typing.get_origin(annotation) in (tuple, list) and spec.parse is None) or spec.several or spec.repeat
        parse = spec.parse
        if parse is None and not is_bool and choices is None:
            parse = _parser_for(annotation, spec, f.name)
        collect = spec.collect or (tuple if typing.get_origin(annotation) is tuple else None)
        help_text = docs.get(f.name, "")
        found.append(Option(f, spec, help_text, default, choices, parse, collect, is_bool, many))
    return tuple(found)


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
                mark_own: bool = False) -> tuple[Option, ...]:
    """Add ``cls``'s flags to ``parser`` (help: the field's docstring as plain text, then the
    default; with ``mark_own``, flags ``vllm serve`` lacks say so); the options added are returned."""
    added = options(cls)
    for option in added:
        help_text = plain_text(option.help)
        shown = option.shown_default
        if shown is not None and not option.is_bool:
            help_text += f" (default: {shown})"
        if mark_own and not option.flag.vllm and not option.flag.positional:
            help_text += " (mmfront's own flag)"
        help_text = help_text.replace("%", "%%")
        if option.flag.positional:
            parser.add_argument(option.dest, metavar=option.name, help=help_text)
        elif option.is_bool:
            parser.add_argument(option.name, *option.flag.aliases, dest=option.dest, action="store_true",
                                default=option.default, help=help_text)
            if option.negation:
                parser.add_argument(option.negation, dest=option.dest, action="store_false",
                                    help=f"turn {option.name} off")
        else:
            kwargs: dict[str, Any] = {"dest": option.dest, "default": option.default, "help": help_text,
                                      "metavar": option.flag.metavar}
            if option.choices is not None:
                kwargs["choices"] = option.choices
                kwargs.pop("metavar")
            if option.parse is not None:
                kwargs["type"] = option.parse
            if option.flag.repeat:
                kwargs["action"] = "append"
            elif option.many:
                kwargs["nargs"] = "+"
            parser.add_argument(option.name, *option.flag.aliases, **kwargs)
    return added


def values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``cls`` that its flags set in parsed ``args``."""
    found = {}
    for option in options(cls):
        value = getattr(args, option.dest)
        found[option.dest] = option.collect(value) if option.collect is not None and value is not None else value
    return found


def check_unique(classes: Sequence[type]) -> None:
    """One command's flags come from several classes: no two may share a field name or a flag."""
    seen: dict[str, type] = {}
    for cls in classes:
        for option in options(cls):
            for key in (option.dest, *option.names):
                if key in seen:
                    raise ConfigError(f"{cls.__name__}.{option.dest}: {key!r} is already a flag of "
                                    f"{seen[key].__name__}; a command's flags need distinct fields and names")
                seen[key] = cls


def flag_table(classes: Sequence[type]) -> str:
    """The Markdown table of every flag ``classes`` declare: the flag, its default, what it does
    (the field's docstring) and the field it sets."""
    rows = ["| flag | default | what it does | sets |", "|---|---|---|---|"]
    for cls in classes:
        for option in options(cls):
            shown = ", ".join(f"`{n}`" for n in option.names)
            if not option.flag.vllm:
                shown += " (mmfront's own)"
            default = option.shown_default
            rows.append(f"| {shown} | {'`' + default + '`' if default is not None else ''} | "
                        f"{markdown(option.help)} | `{cls.__name__}.{option.dest}` |")
    return "\n".join(rows) + "\n"


def field_table(cls: type) -> str:
    """The Markdown table of every field of ``cls``: name, default, meaning and its flag, if any."""
    docs = field_docs(cls)
    flags = {o.dest: o for o in options(cls)}
    rows = ["| field | default | meaning | flag |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        option = flags.get(f.name)
        default = _field_default(f)
        shown = _python_literal(default)
        if option is not None and option.flag.shown_default and option.flag.default is _FIELD_DEFAULT:
            shown = option.flag.shown_default  # it describes the field's own default
        rows.append(f"| `{f.name}` | {shown} | {markdown(docs.get(f.name, ''))} | "
                    f"{'`' + option.name + '`' if option is not None else ''} |")
    return "\n".join(rows) + "\n"


def replace_between(text: str, marker: str, table: str) -> str:
    """``text`` with what lies between ``<!-- marker -->`` and ``<!-- /marker -->`` replaced by ``table``."""
    start, end = f"<!-- {marker} -->\n", f"<!-- /{marker} -->"
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        raise ConfigError(f"no {start.strip()} ... {end} block in the text")
    return head + start + table + end + rest.split(end, 1)[1]


def between(text: str, marker: str) -> str:
    """What lies between ``<!-- marker -->`` and ``<!-- /marker -->`` in ``text``."""
    return text.split(f"<!-- {marker} -->\n", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def counterpart(name: str) -> str:
    """The opposite of boolean flag ``name`` as vLLM spells it: ``--enable-x`` and ``--disable-x``
    are each other's, as are any other ``--x`` and ``--no-x``."""
    for one, other in (("--enable-", "--disable-"), ("--disable-", "--enable-"), ("--no-", "--")):
        if name.startswith(one):
            return other + name.removeprefix(one)
    return "--no-" + name.removeprefix("--")


# --- vLLM's command-line spellings --------------------------------------------------------------


def expand_argv(argv: Sequence[str], known: Collection[str]) -> list[str]:
    """``argv`` as vLLM's ``FlexibleArgumentParser`` rewrites it before parsing, so a ``vllm serve``
    command line means the same to ``mmfront serve``: ``--config FILE.yaml`` is replaced by the
    file's options (placed before the others, so the command line wins); ``--max_model_len`` is
    ``--max-model-len``; dotted options (``--limit-mm-per-prompt.image 4``) are gathered into one
    JSON object per option (``--limit-mm-per-prompt '{"image": 4}'``), ``--x.key+ a,b`` giving
    a list. ``known``: the parser's option strings (a YAML ``false`` becomes ``--no-KEY`` only
    where that exists, as in vLLM)."""
    args = list(argv)
    if "--config" in args:
        args = _pull_config(args, known)
    spelled = []
    for arg in args:
        if arg.startswith("--"):
            key, eq, given = arg.partition("=")
            head, dot, rest = key[2:].partition(".")
            spelled.append("--" + head.replace("_", "-") + dot + rest + eq + given)
        else:
            spelled.append(arg)
    merged: dict[str, dict[str, Any]] = {}
    out: list[str] = []
    skip = False
    for i, arg in enumerate(spelled):
        if skip:
            skip = False
            continue
        key, eq, text = arg.partition("=")
        if not (arg.startswith("--") and "." in key):
            out.append(arg)
            continue
        if not eq:
            if i + 1 >= len(spelled):
                raise ConfigError(f"{key} needs a value")
            text, skip = spelled[i + 1], True
        if key.endswith("+"):
            key, text = key[:-1], json.dumps(text.split(","))
        name, *path = key.split(".")
        value: Any = _dotted_value(text)
        for part in reversed(path):
            value = {part: value}
        _merge(merged.setdefault(name, {}), value)
    for name, value in merged.items():
        out += [name, json.dumps(value)]
    return out


def _dotted_value(text: str) -> Any:
    """A dotted option's value as vLLM reads it: JSON, else a size (``80g``), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return human_int(text)
    except argparse.ArgumentTypeError:
        return text


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] += value
        else:
            into[key] = value


def _pull_config(args: list[str], known: Collection[str]) -> list[str]:
    """vLLM's ``_pull_args_from_config``: the YAML file's options go after the subcommand and the
    model (when the command line names one), before the other options."""
    if args.count("--config") > 1:
        raise ConfigError("--config is given more than once; give one YAML file.")
    index = args.index("--config")
    if index == len(args) - 1:
        raise ConfigError("--config needs a file: --config FILE.yaml")
    from_file = config_file_args(args[index + 1], known)
    rest = args[:index] + args[index + 2:]
    start = 1 if rest and not rest[0].startswith("-") else 0  # the subcommand
    if len(rest) > start and not rest[start].startswith("-"):
        start += 1  # the model, which the command line gives over the file's
    elif "--model" in from_file:
        at = from_file.index("--model")
        model = from_file[at + 1]
        from_file = [model, *from_file[:at], *from_file[at + 2:]]
    return rest[:start] + from_file + rest[start:]


def config_file_args(path: str, known: Collection[str]) -> list[str]:
    """The options a ``vllm serve --config`` YAML file stands for (vLLM's ``load_config_file``):
    ``key: value`` is ``--key value``, ``true`` is ``--key``, ``false`` is ``--no-key`` where that
    exists (else nothing), a list is ``--key a b``, a mapping is ``--key '{JSON}'``."""
    import yaml

    if path.rsplit(".", 1)[-1] not in ("yaml", "yml"):
        raise ConfigError(f"--config takes a YAML file (.yaml or .yml), got {path!r}")
    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"--config {path!r} cannot be read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {path!r} is not valid YAML: {e}") from None
    if loaded is None:
        return []
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path!r} must hold a mapping of option names to values, got "
                          f"{type(loaded).__name__}")
    out: list[str] = []
    for key, value in loaded.items():
        if isinstance(value, bool):
            if value:
                out.append(f"--{key}")
            elif f"--no-{key}" in known:
                out.append(f"--no-{key}")
        elif isinstance(value, list):
            if value:
                out += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


# --- field docstrings ---------------------------------------------------------------------------


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls`` and its bases (as vLLM's ``get_attr_docs``
    reads them); a class whose source cannot be read has none."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, following in zip(body.body, body.body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


_LITERAL = re.compile(r"``(.+?)``")
_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def plain_text(doc: str) -> str:
    """A field docstring as ``--help`` prints it: without RST markup."""
    text = _LITERAL.sub(r"\1", doc)
    return _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), text)


def markdown(doc: str) -> str:
    """A field docstring as a Markdown table cell."""
    text = _LITERAL.sub(r"`\1`", doc)
    text = _ROLE.sub(lambda m: "`" + (m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1)) + "`",
                     text)
    return text.replace("|", "\\|")


# --- values -------------------------------------------------------------------------------------


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _python_literal(value: Any) -> str:
    """A default as the configuration reference writes it."""
    if isinstance(value, frozenset):
        return ", ".join(sorted(value))
    if isinstance(value, Mapping) and not value:
        return "`{}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"`{value:_}`"
    return f"`{value!r}`"


def _without_none(annotation: Any) -> Any:
    """``X | None`` is read as ``X``: a flag left out keeps the field's default."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _parser_for(annotation: Any, spec: Flag, name: str) -> Callable[[str], Any] | None:
    origin = typing.get_origin(annotation) or annotation
    if origin in (int, float):
        return typing.cast(Callable[[str], Any], origin)
    if origin in (tuple, list):
        return None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return json_object(spec.name or "--" + name.replace("_", "-"), spec.example)
    return None


def json_object(flag_name: str, example: str | None = None) -> Callable[[str], dict[str, Any]]:
    """A parser of one JSON object, as vLLM's JSON-valued flags take (``'{"image": 4}'``)."""
    hint = f", e.g. {example}" if example else ""

    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag_name} takes a JSON object{hint}; {text!r} is not JSON ({e})") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag_name} takes a JSON object{hint}; got {text!r}")
        return value
    return parse


def json_list(flag_name: str) -> Callable[[str], tuple[str, ...]]:
    """A parser of one JSON list of strings, as vLLM's CORS flags take (``'["https://a.example"]'``)."""

    def parse(text: str) -> tuple[str, ...]:
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag_name} takes a JSON list, e.g. '[\"*\"]'; {text!r} is not JSON "
                                             f"({e})") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError(f"{flag_name} takes a JSON list of strings, e.g. '[\"*\"]'; got {text!r}")
        return tuple(value)
    return parse


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def human_int(text: str) -> int:
    """An integer as vLLM's ``--max-model-len`` takes it: ``32768``, ``32k`` (x1000) or ``32K`` (x1024)."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 32768, 32k or 32K, got {text!r}")
    value = float(match.group(1)) * _SUFFIX[match.group(2)]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def whole_number_at_least(minimum: int) -> Callable[[str], int]:
    """A parser of whole numbers >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value

    return parse


positive_int = whole_number_at_least(1)
count = whole_number_at_least(0)


def port(text: str) -> int:
    """A TCP port, 0..65535."""
    value = count(text)
    if value >= 1 << 16:
        raise argparse.ArgumentTypeError(f"expected a port number in 0..65535, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


__all__ = [
    "Flag",
    "Option",
    "add_options",
    "between",
    "check_unique",
    "config_file_args",
    "count",
    "counterpart",
    "expand_argv",
    "field_docs",
    "field_table",
    "flag",
    "flag_table",
    "human_int",
    "json_list",
    "json_object",
    "markdown",
    "options",
    "plain_text",
    "port",
    "positive_int",
    "replace_between",
    "seconds",
    "values",
]
