"""The error tree: one root, request errors under ``ValidationError`` with ``parameter``, the
builtin bases vLLM users catch, the drawing in ``errors.py`` kept true, and no raise of a bare
builtin anywhere in ``src/mmfront`` but a few justified ones."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import msgspec
import pytest

import mmfront
from mmfront import errors
from mmfront.cache.base import BaseMultiModalCache
from mmfront.inputs import MultiModalKwargsItems
from mmfront.media.base import MediaWithBytes
from mmfront.parse import MultiModalDataItems
from mmfront.processing._matching import iter_token_matches
from mmfront.serve.app import error_response
from mmfront.serve.errors import ErrorInfo, error_info

PACKAGE_DIR = Path(mmfront.__file__).parent

ERROR_CLASSES = {
    name: obj
    for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
}


# --- every public error is an MMFrontError ------------------------------------------------------


def _all_modules() -> list[str]:
    return [mmfront.__name__] + [m.name for m in pkgutil.walk_packages(mmfront.__path__, prefix="mmfront.")]


def test_every_public_error_class_of_the_package_is_an_mmfront_error() -> None:
    """Private ones (``_TemplateTimeout``) are signals a module raises and catches itself."""
    defined = {}
    for name in _all_modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith("mmfront")
                and not obj.__qualname__.startswith("_")
            ):
                defined[f"{obj.__module__}.{obj.__qualname__}"] = obj
    assert set(ERROR_CLASSES) <= {cls.__name__ for cls in defined.values()}
    assert [name for name, cls in defined.items() if not issubclass(cls, errors.MMFrontError)] == []


def test_errors_module_is_the_bottom_layer() -> None:
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [name for name in imported if name and name.startswith("mmfront")] == []


# --- the drawing in the docstring is the hierarchy ----------------------------------------------

_TREE_LINE = re.compile(r"^    [│├└─ ]*(?P<name>[A-Z]\w+)(?: \[(?P<builtin>\w+)\])?$")


def _drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """``name -> (drawn parent, drawn builtin)`` from the module docstring's tree."""
    assert errors.__doc__ is not None
    drawn: dict[str, tuple[str | None, str | None]] = {}
    stack: list[str] = []
    for line in errors.__doc__.splitlines():
        match = _TREE_LINE.match(line)
        if match is None:
            continue
        depth = (match.start("name") - 4) // 4
        del stack[depth:]
        drawn[match["name"]] = (stack[-1] if stack else None, match["builtin"])
        stack.append(match["name"])
    return drawn


def test_docstring_draws_every_error_class_once() -> None:
    drawn = _drawn_tree()
    assert sorted(drawn) == sorted(ERROR_CLASSES)
    assert drawn["MMFrontError"] == (None, None)
    assert drawn["HashingTypeError"] == ("InputTypeError", None)
    assert drawn["MediaFetchError"] == ("MediaError", None)


@pytest.mark.parametrize("name", sorted(ERROR_CLASSES))
def test_docstring_tree_matches_the_class_bases(name: str) -> None:
    parent, builtin = _drawn_tree()[name]
    cls = ERROR_CLASSES[name]
    if parent is None:
        assert cls.__bases__ == (Exception,)
        return
    assert [b.__name__ for b in cls.__bases__ if b.__module__ == errors.__name__] == [parent]
    assert [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"] == ([builtin] if builtin else [])


# --- compatibility: the builtins vLLM users catch -----------------------------------------------

BUILTIN_OF: dict[str, tuple[type[BaseException], ...]] = {
    "ConfigError": (ValueError,),
    "ModelFilesNotFoundError": (ValueError,),
    "UnsupportedModelError": (ValueError,),
    "MissingOffsetsError": (ValueError,),
    "FieldConfigError": (ValueError,),
    "ValidationError": (ValueError,),
    "RequestBodyError": (ValueError,),
    "BodyTooLargeError": (ValueError,),
    "ModelNotFoundError": (ValueError,),
    "InputTypeError": (TypeError, ValueError),
    "HashingTypeError": (TypeError, ValueError),
    "UnsupportedModalityError": (ValueError,),
    "ChatFormatError": (ValueError,),
    "PromptUpdateError": (ValueError,),
    "ProcessorError": (ValueError,),
    "MediaError": (ValueError,),
    "MediaDecodeError": (ValueError,),
    "MediaEncodingNotSupportedError": (ValueError,),
    "MediaFormatError": (ValueError,),
    "MediaTooLargeError": (ValueError,),
    "MediaPathError": (ValueError,),
    "MediaFetchError": (ValueError,),
    "MediaURLNotAllowedError": (ValueError,),
    "ModalityNotFoundError": (KeyError,),
    "MultiModalCacheMissError": (RuntimeError,),
    "CacheError": (RuntimeError,),
    "ResourceError": (OSError,),
    "AddressInUseError": (OSError,),
    "ShmHandleError": (ValueError,),
    "DecodeError": (ValueError,),
    "UnknownUtilityError": (ValueError,),
    "EncodeError": (TypeError,),
    "TransportError": (RuntimeError,),
    "EngineDeadError": (RuntimeError,),
    "HandshakeError": (RuntimeError,),
    "UtilityCallError": (RuntimeError,),
    "LaneError": (RuntimeError,),
    "GenerationError": (RuntimeError,),
    "RetryableRequestError": (RuntimeError,),
}


@pytest.mark.parametrize("name", sorted(BUILTIN_OF))
def test_errors_keep_the_builtin_base_vllm_code_catches(name: str) -> None:
    cls = ERROR_CLASSES[name]
    assert issubclass(cls, errors.MMFrontError)
    assert all(issubclass(cls, builtin) for builtin in BUILTIN_OF[name])


def test_every_error_but_the_root_has_a_compatibility_entry() -> None:
    assert sorted(BUILTIN_OF) == sorted(set(ERROR_CLASSES) - {"MMFrontError"})


# --- request errors: one root, each carrying ``parameter`` ---------------------------------------

REQUEST_ERRORS = sorted(name for name, cls in ERROR_CLASSES.items() if issubclass(cls, errors.ValidationError))


def test_request_errors_are_the_validation_error_subtree() -> None:
    assert REQUEST_ERRORS == [
        "BodyTooLargeError",
        "ChatFormatError",
        "HashingTypeError",
        "InputTypeError",
        "MediaDecodeError",
        "MediaEncodingNotSupportedError",
        "MediaError",
        "MediaFetchError",
        "MediaFormatError",
        "MediaPathError",
        "MediaTooLargeError",
        "MediaURLNotAllowedError",
        "ModelNotFoundError",
        "ProcessorError",
        "PromptUpdateError",
        "RequestBodyError",
        "UnsupportedModalityError",
        "ValidationError",
    ]


@pytest.mark.parametrize("name", REQUEST_ERRORS)
def test_every_request_error_carries_parameter(name: str) -> None:
    error = ERROR_CLASSES[name]("message")
    assert error.parameter is None
    assert str(error) == "message"


@pytest.mark.parametrize(
    ("error", "parameter"),
    [
        (errors.InputTypeError("prompt must be a string", parameter="prompt"), "prompt"),
        (errors.HashingTypeError("cannot hash a set", parameter="mm_processor_kwargs"), "mm_processor_kwargs"),
        (errors.ProcessorError("the HF processor raised", parameter="multi_modal_data"), "multi_modal_data"),
        (errors.PromptUpdateError("2 placeholders, 1 found", modality="image", expected=2, found=1), "image"),
        (errors.MediaFetchError("HTTP 503", parameter="multi_modal_data", retryable=True), "multi_modal_data"),
        (errors.ChatFormatError("unknown part type", parameter="messages"), "messages"),
    ],
)
def test_request_error_parameter_is_kept(error: errors.ValidationError, parameter: str) -> None:
    assert error.parameter == parameter
    assert isinstance(error, errors.ValidationError)


def test_input_type_error_is_caught_as_request_error_and_as_type_error() -> None:
    for catch in (errors.ValidationError, TypeError, ValueError, errors.MMFrontError):
        with pytest.raises(catch):
            raise errors.InputTypeError("bad type", parameter="prompt", value=3)


REQUEST_FACING = ("parse.py", "preprocess.py", "chat.py", "chat_template.py", "media/")
"""Modules that read the request itself, so they always know the field at fault; deeper layers
(an HF processor failing, a value hashing cannot encode) may leave ``parameter`` as ``None``."""


def test_request_facing_modules_name_the_parameter_of_every_request_error() -> None:
    request_errors = set(REQUEST_ERRORS)
    missing = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = path.relative_to(PACKAGE_DIR).as_posix()
        if not module.startswith(REQUEST_FACING):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in request_errors:
                keywords = {keyword.arg for keyword in call.keywords}
                if not keywords & {"parameter", "modality", None}:
                    missing.append(f"{module}:{node.lineno} {call.func.id}")
    assert missing == [], "pass parameter= naming the request field at fault"


# --- the raises that used to be bare builtins -----------------------------------------------------


def test_negative_start_idx_is_a_validation_error_naming_it() -> None:
    with pytest.raises(errors.ValidationError, match="start_idx must be non-negative") as info:
        list(iter_token_matches([1, 2], [1], start_idx=-3))
    assert (info.value.parameter, info.value.value) == ("start_idx", -3)


class _EchoCache(BaseMultiModalCache[int, int]):
    def get_and_update_item(self, mm_item: int, mm_hash: str) -> int:
        return mm_item

    def clear_cache(self) -> None:
        pass


def test_cache_update_with_mismatched_hashes_is_a_validation_error() -> None:
    assert _EchoCache().get_and_update([1, 2], ["a", "b"]) == [1, 2]
    with pytest.raises(errors.ValidationError, match="Got 2 items for 1 hashes") as info:
        _EchoCache().get_and_update([1, 2], ["a"])
    assert info.value.parameter == "mm_hashes"


@pytest.mark.parametrize("kwargs", [{}, {"media": 1, "decode": lambda: 1}])
def test_media_with_bytes_needs_one_source(kwargs: dict[str, object]) -> None:
    with pytest.raises(errors.InputTypeError, match="exactly one of `media` and `decode`") as info:
        MediaWithBytes(**kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == "media"


def test_missing_modality_is_a_key_error_with_a_plain_message() -> None:
    items = MultiModalDataItems()
    with pytest.raises(errors.ModalityNotFoundError) as info:
        items.get_count("audio")
    assert str(info.value) == "Modality 'audio' not found. Available modalities: []"
    assert isinstance(info.value, KeyError)
    kwargs_items = MultiModalKwargsItems()
    with pytest.raises(errors.ModalityNotFoundError, match="Modality 'image' not found"):
        kwargs_items["image"]
    assert kwargs_items.get("image") is None


# --- no raise of a builtin exception in src/mmfront --------------------------------------------

BUILTIN_EXCEPTIONS = frozenset(
    name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, BaseException)
)

ALLOWED_BUILTIN_RAISES: dict[tuple[str, str, str], str] = {
    ("serve/structured.py", "*", "ValueError"): "the grammar libraries' own signal (xgrammar and llguidance raise "
    "ValueError for a bad constraint), raised and caught inside the module, which answers ValidationError",
    ("serve/tool_parsers/pythonic.py", "*", "ValueError"): "ast literal evaluation's signal, caught in the same module: "
    "text that is not a call list is content, as vLLM's pythonic parser treats it",
    ("serve/tool_parsers/llama3_json.py", "JsonCallSteps._step", "ValueError"): "a stream step vLLM's llama3_json "
    "parser fails (both parameters and arguments), caught in the same module's feed, which then sends nothing for "
    "the step, as vLLM's does",
    ("serve/tool_parsers/llama3_json.py", "JsonCallSteps._step", "TypeError"): "a stream step vLLM's llama3_json "
    "parser fails (a name that is not a string), caught in the same module's feed, which then sends nothing for "
    "the step, as vLLM's does",
    ("serve/tool_parsers/base.py", "ToolParser.extract", "NotImplementedError"): "the method a ToolParser subclass "
    "(a format users register) must provide",
    ("engine/worker.py", "StopSignals.__call__", "SystemExit"): "a stop signal while the worker starts (loading, "
    "the handshake) ends the process with status 0, as vLLM's engine core ends on SIGTERM",
    ("cli.py", "*", "SystemExit"): "the command-line entry point ends with a message and exit status 1, as argparse "
    "does; library code never exits",
    ("wire/pipe.py", "_recv_header_and_fd", "EOFError"): "the pipe protocol of multiprocessing.Connection, which "
    "BaseTransport.recv documents: EOFError means the peer closed its end",
    ("wire/pipe.py", "_read_into", "OSError"): "a short read is a broken link, as multiprocessing reports it; "
    "PipeTransport turns it into TransportError",
    ("wire/messages.py", "MirrorOp.__post_init__", "ValueError"): "msgspec's __post_init__ protocol: msgspec turns "
    "a ValueError there into its ValidationError, which the codec reports as DecodeError",
    ("media/base.py", "MediaWithBytes.__getattr__", "AttributeError"): "the __getattr__ protocol: hasattr, copy "
    "and pickle expect AttributeError",
    ("serve/launcher.py", "exit_on_sigterm", "SystemExit"): "mmfront serve's SIGTERM handler: the server process "
    "ends through its finally blocks (engines stopped in order), as it does on Ctrl-C",
    ("__init__.py", "__getattr__", "AttributeError"): "the module __getattr__ protocol (PEP 562) that imports "
    "mmfront's public names on first use: from-imports and hasattr expect AttributeError",
    ("media/fetch.py", "_Deadline.remaining", "TimeoutError"): "stands for a socket timeout inside urllib's reads, "
    "which fetch_bytes turns into MediaFetchError",
}
"""``(module path under src/mmfront, enclosing function, exception) -> why it must stay a builtin``;
``*`` allows the whole module."""


class _BuiltinRaises(ast.NodeVisitor):
    """Collects ``(enclosing qualname, builtin name, line)`` for every ``raise`` of a builtin
    exception class or instance (``raise ValueError``, ``raise KeyError(...)``,
    ``raise builtins.TypeError(...)``); a bare re-raise or a raise of a variable is not one."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, str, int]] = []

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def visit_Raise(self, node: ast.Raise) -> None:
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = None
        if isinstance(target, ast.Name):
            name = target.id
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "builtins":
            name = target.attr
        if name in BUILTIN_EXCEPTIONS:
            self.found.append((".".join(self.scope) or "<module>", name, node.lineno))
        self.generic_visit(node)


def builtin_raises(source: str) -> list[tuple[str, str, int]]:
    walker = _BuiltinRaises()
    walker.visit(ast.parse(source))
    return walker.found


def test_walker_flags_builtin_raises_only() -> None:
    source = inspect.cleandoc("""
        import builtins
        from mmfront.errors import DecodeError

        class Thing:
            def bad(self, x: int) -> None:
                if x:
                    raise ValueError("no")
                raise KeyError

        def fine(exc: Exception) -> None:
            try:
                pass
            except OSError:
                raise
            raise DecodeError("typed") from exc

        def also_bad() -> None:
            raise builtins.TypeError("no")

        def passes_on(exc: Exception) -> None:
            raise exc
    """)
    assert builtin_raises(source) == [
        ("Thing.bad", "ValueError", 7),
        ("Thing.bad", "KeyError", 8),
        ("also_bad", "TypeError", 18),
    ]


def _src_builtin_raises() -> list[tuple[str, str, str, int]]:
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = path.relative_to(PACKAGE_DIR).as_posix()
        found += [(module, scope, name, line) for scope, name, line in builtin_raises(path.read_text())]
    return found


def _allowed(module: str, scope: str, name: str) -> bool:
    return (module, scope, name) in ALLOWED_BUILTIN_RAISES or (module, "*", name) in ALLOWED_BUILTIN_RAISES


def test_src_raises_no_builtin_exception_outside_the_allow_list() -> None:
    offenders = [
        f"{module}:{line} {scope} raises {name}"
        for module, scope, name, line in _src_builtin_raises()
        if not _allowed(module, scope, name)
    ]
    assert offenders == [], "raise a typed error from mmfront.errors instead"


def test_every_allow_list_entry_is_still_needed() -> None:
    used = set()
    for module, scope, name, _ in _src_builtin_raises():
        used.add((module, "*", name) if (module, "*", name) in ALLOWED_BUILTIN_RAISES else (module, scope, name))
    assert sorted(set(ALLOWED_BUILTIN_RAISES) - used) == []


TROUBLESHOOTING = Path(__file__).parents[1] / "docs" / "troubleshooting.md"


def _documented_answers() -> dict[str, tuple[int, str]]:
    """``name -> (status, type)`` from the HTTP column of docs/troubleshooting.md's tables."""
    page = TROUBLESHOOTING.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| (\d{3}) ([A-Za-z ]+?)[;|]", page, flags=re.MULTILINE)
    return {name: (int(status), kind.strip()) for name, status, kind in rows}


def test_troubleshooting_page_has_a_row_for_every_error() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \|", TROUBLESHOOTING.read_text(encoding="utf-8"), flags=re.MULTILINE))
    assert rows == set(ERROR_CLASSES) - {"MMFrontError"}
    assert set(_documented_answers()) == rows


# --- how an API server answers each error: the documented table is the classes' ------------------


def _an_error(cls: type[errors.MMFrontError]) -> errors.MMFrontError:
    if issubclass(cls, errors.MultiModalCacheMissError):
        return cls(["h1", "h2"])
    return cls("message")


@pytest.mark.parametrize("name", sorted(set(ERROR_CLASSES) - {"MMFrontError"}))
def test_every_error_class_answers_as_troubleshooting_md_documents(name: str) -> None:
    """The walk of the whole tree: the class's status and type, and what the server answers for
    an instance of it (no ``parameter``: ``param`` null, the message as it is)."""
    cls = ERROR_CLASSES[name]
    assert issubclass(cls, errors.MMFrontError)
    status, kind = _documented_answers()[name]
    assert (cls.http_status, cls.error_type) == (status, kind)
    error = _an_error(cls)
    assert error_info(error) == ErrorInfo(str(error), kind, None, status)


def test_the_root_and_unexpected_exceptions_answer_500() -> None:
    assert error_info(errors.MMFrontError("boom")) == ErrorInfo("boom", "InternalServerError", None, 500)
    assert error_info(errors.MMFrontError()) == ErrorInfo("Internal server error", "InternalServerError", None, 500)
    assert error_info(ZeroDivisionError("division by zero")) == ErrorInfo(
        "division by zero", "InternalServerError", None, 500)


@pytest.mark.parametrize(("error", "answer"), [
    # the three drifts the issue found, fixed: served as documented, or as vLLM's code answers
    (errors.ResourceError("out of open files", resource="open files"),
     ErrorInfo("out of open files", "ServiceUnavailableError", None, 503)),
    (errors.MediaDecodeError("not an image", parameter="image"),
     ErrorInfo("not an image (parameter=image)", "BadRequestError", "image", 400)),
    (errors.ValidationError("Request 'a' is already running; use a new request id.", parameter="request_id"),
     ErrorInfo("Request 'a' is already running; use a new request id. (parameter=request_id)", "BadRequestError",
               "request_id", 400)),
    # vLLM's answers for the same situations
    (errors.MediaFetchError("HTTP 404", parameter="image_url"),
     ErrorInfo("HTTP 404 (parameter=image_url)", "UnprocessableEntityError", "image_url", 422)),
    (errors.MediaFetchError("HTTP 503", parameter="image_url", retryable=True),
     ErrorInfo("HTTP 503 (parameter=image_url)", "InternalServerError", "image_url", 500)),
    (errors.MediaURLNotAllowedError("not in allowed_media_domains", parameter="image_url"),
     ErrorInfo("not in allowed_media_domains (parameter=image_url)", "BadRequestError", "image_url", 400)),
    (errors.EngineDeadError("The engine link broke."), ErrorInfo("The engine link broke.", "InternalServerError", None, 500)),
    (errors.TransportError("The client is closed."), ErrorInfo("The client is closed.", "ServiceUnavailableError", None, 503)),
    # request errors name their parameter and value in the message, as str(VLLMValidationError) does
    (errors.ValidationError("too long", parameter="max_tokens", value=9),
     ErrorInfo("too long (parameter=max_tokens, value=9)", "BadRequestError", "max_tokens", 400)),
    (errors.PromptUpdateError("2 placeholders, 1 found", modality="image"),
     ErrorInfo("2 placeholders, 1 found (parameter=image)", "BadRequestError", "image", 400)),
    # except the body's shape and an unknown model, which vLLM words without it
    (errors.RequestBodyError("missing required field `messages`", parameter="body.messages"),
     ErrorInfo("missing required field `messages`", "Bad Request", "body.messages", 400)),
    (errors.ModelNotFoundError("The model `x` does not exist.", parameter="model"),
     ErrorInfo("The model `x` does not exist.", "NotFoundError", "model", 404)),
    (errors.BodyTooLargeError("too large"), ErrorInfo("too large", "Request Entity Too Large", None, 413)),
])
def test_the_server_answers_each_error_by_its_class(error: errors.MMFrontError, answer: ErrorInfo) -> None:
    assert error_info(error) == answer
    assert msgspec.json.decode(error_response(error).body) == {"error": msgspec.structs.asdict(answer)}
    assert error_response(error).status_code == answer.code
