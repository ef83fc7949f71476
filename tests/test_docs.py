"""Every code block in README.md and docs/*.md runs, so the docs cannot drift from the code.

How blocks are treated (documented for authors in docs/testing.md, "Docs that run"):

* ```` ```python ```` blocks are executed. The blocks of one file share one namespace, in file
  order, so a later block may use what an earlier one defined; running one block alone runs the
  earlier blocks of its file first.
* ```` ```sh ```` / ``bash`` / ``shell`` / ``console`` blocks are checked command by command:
  ``mmfront --help`` / ``--version`` style commands are run in a subprocess, ``mmfront demo`` /
  ``bench`` are parsed by the real argument parser, ``make`` targets must exist in the Makefile,
  ``python -m pytest`` paths must exist. Any other command is an error until a check is added.
* ```` ```text ```` (output, diagrams, layouts) and ``json`` blocks are not run; a block without
  a language is an error.
* ``<!-- fixture: NAME[, NAME] -->`` on the line right before a block gives it the names of the
  ``docs_NAME`` fixtures below (e.g. ``model_dir``); they stay in the file's namespace, and the
  fixture stays in effect for the file's later blocks.
* Blocks run in a temporary working directory (one per file), with ``MMFRONT_HOME`` pointing at
  a temporary folder, so they may write relative paths and build the default model freely.
* A ``test_*`` function a block defines (the example tests of docs/testing.md) is called with
  the project's fixtures as arguments, honouring its ``hf_version`` mark.
* Every block is linted: no machine paths, no ``...`` pseudo-code, no URL host other than
  localhost, 127.0.0.1 and example.com.
"""

from __future__ import annotations

import base64
import importlib.metadata
import inspect
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
import urllib.response
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from io import BytesIO
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [p for p in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                         REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md") if p.is_file()]

HF_VERSION = Version(importlib.metadata.version("transformers"))

PYTHON_LANGS = frozenset({"python", "py"})
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
SKIPPED_LANGS = frozenset({"text", "json"})

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)\s*$")
FIXTURE_COMMENT = re.compile(r"^\s*<!--\s*fixture:\s*(?P<names>[\w\s,-]+?)\s*-->\s*$")
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|models|Users/[\w.-]+|home/[\w.-]+)(?![\w.-])")
URL = re.compile(r"https?://[^\s\"'`)<>]+")
ALLOWED_HOSTS = frozenset({"localhost", "127.0.0.1", "example.com"})
PSEUDO_CODE = re.compile(r"\.\.\.|…")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (the opening fence's line), its language and text."""

    path: Path
    line: int
    lang: str
    code: str
    fixtures: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path.name}:{self.line}"


def _dedent(line: str, indent: int) -> str:
    """``line`` without the indentation of its fence (a block inside a list item)."""
    stripped = line[:indent]
    return line[indent:] if not stripped or stripped.isspace() else line.lstrip()


def extract_blocks(path: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of a markdown file, with the fixtures declared on the line before each."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: the code block is never closed")
        declared = FIXTURE_COMMENT.match(lines[i - 1]) if i else None
        fixtures = tuple(n.strip() for n in declared["names"].split(",") if n.strip()) if declared else ()
        code = "\n".join(_dedent(line, indent) for line in lines[i + 1:end])
        blocks.append(Block(path, i + 1, opening["lang"].lower(), code + "\n", fixtures))
        i = end + 1
    return blocks


def lint(block: Block) -> list[str]:
    """What makes a block unfit to be shown as working code."""
    problems = []
    if not block.lang:
        problems.append("the block has no language: mark output and diagrams ```text, code ```python or ```sh")
    elif block.lang not in PYTHON_LANGS | SHELL_LANGS | SKIPPED_LANGS:
        problems.append(f"unknown language {block.lang!r}: use one of {sorted(PYTHON_LANGS | SHELL_LANGS | SKIPPED_LANGS)}")
    problems += [f"machine path {m!r}: use a folder from a fixture, or a relative path"
                 for m in MACHINE_PATH.findall(block.code)]
    for url in URL.findall(block.code):
        host = urlsplit(url).hostname
        if host not in ALLOWED_HOSTS:
            problems.append(f"URL host {host!r} in {url!r}: use one of {sorted(ALLOWED_HOSTS)}")
    if block.lang in PYTHON_LANGS | SHELL_LANGS and PSEUDO_CODE.search(block.code):
        problems.append("'...' pseudo-code or elided output: write code that runs, and state results in words")
    return problems


# --- shell blocks -----------------------------------------------------------------------------


def shell_commands(code: str, *, console: bool = False) -> list[list[str]]:
    """The simple commands of a shell block (split at ``&&``, ``||``, ``;`` and ``|``), without
    comments, leading ``VAR=value`` assignments, or, for ``console`` blocks, output lines."""
    commands: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        if console:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in [*lexer, ";"]:
            if token in ("&&", "||", ";", "|", "&"):
                while current and re.match(r"^[A-Za-z_]\w*=", current[0]):
                    current.pop(0)
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return {t for m in re.finditer(r"^([\w.%/$() -]+):(?!=)", text, re.M) for t in m.group(1).split()}


def check_command(argv: list[str]) -> str | None:
    """Run or check one command from a shell block; a problem as a message, else ``None``."""
    from mmfront.cli import build_parser

    program, args = Path(argv[0]).name, argv[1:]
    if program == "make":
        unknown = [t for t in args if not t.startswith("-") and "=" not in t and t not in makefile_targets()]
        return f"make targets {unknown} are not in the Makefile" if unknown else None
    if program == "mmfront":
        if {"-h", "--help", "--version"} & set(args):
            done = subprocess.run([sys.executable, "-m", "mmfront.cli", *args], capture_output=True, text=True,
                                  timeout=120, check=False, cwd=REPO)
            return None if done.returncode == 0 else f"{shlex.join(argv)} exited {done.returncode}: {done.stderr}"
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:
            return f"{shlex.join(argv)} does not parse (exit {exc.code}); see mmfront --help"
        return None
    if program.startswith("python") and args[:2] == ["-m", "pytest"]:
        missing = [a for a in args[2:] if not a.startswith("-") and not (REPO / a.split("::")[0]).exists()]
        return f"pytest paths {missing} do not exist" if missing else None
    if program in ("bash", "sh"):
        script = next((a for a in args if not a.startswith("-")), "")
        outside = script.startswith("../")  # a sibling checkout such as ../shared, not part of this repo
        return None if outside or (REPO / script).is_file() else f"script {script!r} does not exist"
    if program in ("cd", "mkdir"):
        return None
    return f"no check for {program!r}: run it from a python block, or add a check to tests/test_docs.py"


# --- python blocks ----------------------------------------------------------------------------


def _catalog_copies() -> dict[tuple[Any, str], dict[str, Any]]:
    from mmfront.fixtures import catalog as fixture_catalog
    from mmfront.models import catalog

    catalog.model_specs()  # the built-in modules first, so the copies hold them
    fixture_catalog.fixture_kinds()
    tables = [(catalog, "_NATIVE"), (catalog, "_NATIVE_BY_MODEL_TYPE"), (catalog, "_MODELS"),
              (fixture_catalog, "_KINDS")]
    return {(module, name): dict(getattr(module, name)) for module, name in tables}


@dataclass
class _FileRun:
    """The namespace one file's python blocks share, and how far they have run.

    ``catalogs``: the file's own copies of the processor and model catalogs, in effect while its
    blocks run. A block that registers a processor (docs/processing.md registers one for
    ``LlavaProcessor``) changes its file's copy only: later tests in the worker build the real
    processors, not the page's example.
    """

    workdir: Path
    namespace: dict[str, Any] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    failed: str | None = None
    catalogs: dict[tuple[Any, str], dict[str, Any]] = field(default_factory=_catalog_copies)


_RUNS: dict[Path, _FileRun] = {}


def activate_fixture(request: pytest.FixtureRequest, block: Block, name: str) -> dict[str, Any]:
    """The names the ``docs_<name>`` fixture gives; requesting it also starts what it patches."""
    try:
        names: dict[str, Any] = request.getfixturevalue(f"docs_{name.replace('-', '_')}")
    except pytest.FixtureLookupError:
        known = sorted(n.removeprefix("docs_") for n in globals() if n.startswith("docs_"))
        pytest.fail(f"{block.id}: unknown docs fixture {name!r}; known: {known}")
    return names


def run_python(block: Block, run: _FileRun, request: pytest.FixtureRequest) -> None:
    for name in block.fixtures:
        run.namespace.update(activate_fixture(request, block, name))
    run.namespace.setdefault("__name__", f"docs.{block.path.stem}")
    code = compile("\n" * block.line + block.code, str(block.path.relative_to(REPO)), "exec")
    before = dict(run.namespace)
    try:
        exec(code, run.namespace)
        for name, fn in list(run.namespace.items()):
            if name.startswith("test_") and callable(fn) and before.get(name) is not fn:
                run_example_test(fn, request)
    except BaseException:
        run.failed = block.id
        raise
    finally:
        run.done.add(block.line)


def run_example_test(fn: Callable[..., Any], request: pytest.FixtureRequest) -> None:
    """Call a ``test_*`` function a block defines (an example test), with the project's fixtures
    as its arguments, unless its ``hf_version`` mark excludes the installed transformers."""
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == "hf_version" and not SpecifierSet(mark.args[0]).contains(HF_VERSION, prereleases=True):
            return
    fn(**{name: request.getfixturevalue(name) for name in inspect.signature(fn).parameters})


def _collect() -> list[Block]:
    return [b for path in DOC_FILES for b in extract_blocks(path)]


ALL_BLOCKS = _collect()
RUNNABLE = [b for b in ALL_BLOCKS if b.lang in PYTHON_LANGS | SHELL_LANGS]


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.id)
def test_block_is_clean(block: Block) -> None:
    assert lint(block) == []


@pytest.mark.usefixtures("preloaded_lane_parents")  # a block's lanes: what they send, not their parent's start
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    if block.lang in SHELL_LANGS:
        problems = [p for argv in shell_commands(block.code, console=block.lang == "console")
                    if (p := check_command(argv))]
        assert problems == []
        return
    run = _RUNS.get(block.path)
    if run is None:
        run = _RUNS[block.path] = _FileRun(tmp_path_factory.mktemp(f"docs-{block.path.stem}"))
    monkeypatch.chdir(run.workdir)
    for (module, name), table in run.catalogs.items():
        monkeypatch.setattr(module, name, table)
    # One private MMFRONT_HOME for the session: default_model_dir() builds once, never in ~/.cache.
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path_factory.getbasetemp() / "docs-mmfront-home"))
    # A fixture declared on an earlier block stays in effect (web keeps serving example.com); its
    # names are not given again, so a block that reassigned one keeps its own value.
    for name in sorted({f for b in RUNNABLE if b.path == block.path and b.line < block.line for f in b.fixtures}):
        activate_fixture(request, block, name)
    for earlier in RUNNABLE:
        if run.failed:
            pytest.fail(f"{block.id} runs after {run.failed} in the same namespace, and that block failed")
        if earlier.path != block.path or earlier.lang not in PYTHON_LANGS or earlier.line in run.done:
            continue
        if earlier.line == block.line:
            break
        run_python(earlier, run, request)
    run_python(block, run, request)


# --- fixtures blocks can declare --------------------------------------------------------------


@pytest.fixture(scope="session")
def docs_gemma3(gemma3_dir: Path) -> dict[str, Any]:
    """``model_dir``: a tiny Gemma 3 folder (32 px, 16 tokens per image)."""
    return {"model_dir": gemma3_dir}


@pytest.fixture(scope="session")
def docs_idefics3(idefics3_dir: Path, idefics3_processor: Any) -> dict[str, Any]:
    """``model_dir``: a tiny Idefics3 folder; ``hf_processor``: the HF processor loaded from it."""
    return {"model_dir": idefics3_dir, "hf_processor": idefics3_processor}


@pytest.fixture(scope="session")
def docs_media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``pil_image``: a 64x48 RGB image; ``png_url``: it as a PNG data URL; ``media_with_bytes``:
    that PNG loaded lazily by a ``MediaConnector``; ``waveform``: 1 s of float32 audio at 16 kHz;
    ``wav_url``: that audio as a WAV data URL; ``media_dir``: an absolute folder holding
    ``cat.png`` (the PNG) and ``hello.wav`` (the audio)."""
    from mmfront.config import MultiModalConfig
    from mmfront.media import DecodeBudget, MediaConnector
    from mmfront.testing.media import image_data_url, make_audio, make_image, wav_bytes

    pil_image = make_image(64, 48)
    png_url = image_data_url(pil_image)
    config = MultiModalConfig()
    loaded = MediaConnector(config).load_image(png_url, budget=DecodeBudget.from_config(config))
    wav_url = f"data:audio/wav;base64,{base64.b64encode(wav_bytes(make_audio(1.0), 16000)).decode()}"
    media_dir = tmp_path_factory.mktemp("media")
    pil_image.save(media_dir / "cat.png")
    (media_dir / "hello.wav").write_bytes(wav_bytes(make_audio(1.0), 16000))
    return {"pil_image": pil_image, "png_url": png_url, "media_with_bytes": loaded, "waveform": make_audio(1.0),
            "wav_url": wav_url, "media_dir": str(media_dir)}


class _ExampleCom(urllib.request.BaseHandler):
    """Answers http(s) requests to example.com (and its subdomains) from memory: a path ending
    in .png / .jpg / .jpeg gets a generated image, .wav a second of generated audio, anything
    else 404. Other hosts are refused, as a machine without network would."""

    handler_order = 100  # before urllib's HTTP(S)Handler (500), which would go to the network

    def _answer(self, req: urllib.request.Request) -> Any:
        from mmfront.testing.media import make_audio, make_image, wav_bytes

        parts = urlsplit(req.full_url)
        if parts.hostname != "example.com" and not (parts.hostname or "").endswith(".example.com"):
            raise urllib.error.URLError(ConnectionRefusedError(f"{parts.hostname} is not served offline"))
        suffix = Path(parts.path).suffix.lower()
        if suffix in (".png", ".jpg", ".jpeg"):
            buf = BytesIO()
            make_image(640, 480).save(buf, format="PNG" if suffix == ".png" else "JPEG")
            body, status = buf.getvalue(), 200
        elif suffix == ".wav":
            body, status = wav_bytes(make_audio(1.0), 16000), 200
        else:
            body, status = b"not found", 404
        headers = Message()
        headers["Content-Length"] = str(len(body))
        if status != 200:
            raise urllib.error.HTTPError(req.full_url, status, "Not Found", headers, BytesIO(body))
        response = urllib.response.addinfourl(BytesIO(body), headers, req.full_url, status)
        response.msg = "OK"
        return response

    def http_open(self, req: urllib.request.Request) -> Any:
        return self._answer(req)

    def https_open(self, req: urllib.request.Request) -> Any:
        return self._answer(req)


@pytest.fixture
def docs_web(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """example.com offline: while the block runs, urllib openers built by mmfront fetch
    ``https://example.com/<name>.png|.jpg|.wav`` from generated media (mmfront's allowlist,
    size cap and body reading still run). Gives no names."""
    build_opener = urllib.request.build_opener

    def offline_opener(*handlers: Any) -> urllib.request.OpenerDirector:
        return build_opener(_ExampleCom(), *handlers)

    monkeypatch.setattr(urllib.request, "build_opener", offline_opener)
    return {}


# --- the runner itself ------------------------------------------------------------------------

SAMPLE = """# Title

```python
x = 1
```

<!-- fixture: gemma3, web -->
```py
y = x + 1
```

- a list item:

  ```sh
  make demo && mmfront --version  # comment
  ```

```
no language
```

````text
```python
not a block of its own
```
````
"""


def test_extract_blocks_finds_lines_languages_fixtures_and_nesting(tmp_path: Path) -> None:
    blocks = extract_blocks(tmp_path / "x.md", SAMPLE)
    assert [(b.line, b.lang, b.fixtures) for b in blocks] == [
        (3, "python", ()), (8, "py", ("gemma3", "web")), (14, "sh", ()), (18, "", ()), (22, "text", ()),
    ]
    assert blocks[2].code == "make demo && mmfront --version  # comment\n"
    assert blocks[4].code == "```python\nnot a block of its own\n```\n"


def test_extract_blocks_refuses_an_unclosed_block(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"x.md:1: the code block is never closed"):
        extract_blocks(tmp_path / "x.md", "```python\nx = 1\n")


@pytest.mark.parametrize(("lang", "code", "problem"), [
    ("python", "open('" + "/wo" + "rk/main/x')\n", "machine path '/work'"),
    ("python", "p = '" + "/ho" + "me/alice/m'\n", "machine path '" + "/ho" + "me/alice'"),
    ("sh", "cd /root && ls\n", "machine path '/root'"),
    ("python", "load('/models/gemma-3-4b-it')\n", "machine path '/models'"),
    ("python", "url = 'data:image/png;base64,iVBORw0...'\n", "'...' pseudo-code"),
    ("python", "def f(): ...\n", "'...' pseudo-code"),
    ("python", "fetch('https://images.example.org/cat.png')\n", "URL host 'images.example.org'"),
    ("text", "see http://internal.corp:8080/x\n", "URL host 'internal.corp'"),
    ("", "x\n", "the block has no language"),
    ("rust", "fn main() {}\n", "unknown language 'rust'"),
])
def test_lint_names_each_problem(lang: str, code: str, problem: str) -> None:
    problems = lint(Block(REPO / "x.md", 1, lang, code))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_lint_accepts_clean_blocks() -> None:
    good = "p = Path('models/idefics3'); u = 'https://example.com/a.png'; v = 'http://127.0.0.1:8000/'\n"
    assert lint(Block(REPO / "x.md", 1, "python", good)) == []
    assert lint(Block(REPO / "x.md", 1, "text", "[...] elided output is fine in text\n")) == []


def test_shell_commands_split_and_strip() -> None:
    code = "A=1 B=2 make demo && cd x; mmfront bench \\\n  --quick | tee log  # run it\n"
    assert shell_commands(code) == [["make", "demo"], ["cd", "x"], ["mmfront", "bench", "--quick"], ["tee", "log"]]
    assert shell_commands("$ mmfront --version\nmmfront 0.1.0\n", console=True) == [["mmfront", "--version"]]


@pytest.mark.parametrize(("argv", "problem"), [
    (["make", "deploy"], "make targets ['deploy'] are not in the Makefile"),
    ([".venv/bin/mmfront", "bench", "--fast"], ".venv/bin/mmfront bench --fast does not parse (exit 2)"),
    (["mmfront", "serve"], "mmfront serve does not parse"),
    (["python", "-m", "pytest", "tests/no_such_test.py"], "pytest paths ['tests/no_such_test.py'] do not exist"),
    (["bash", "scripts/setup.sh"], "script 'scripts/setup.sh' does not exist"),
    (["curl", "https://example.com"], "no check for 'curl'"),
])
def test_check_command_reports_what_is_wrong(argv: list[str], problem: str) -> None:
    message = check_command(argv)
    assert message is not None and message.startswith(problem), message


def test_check_command_accepts_real_commands() -> None:
    assert check_command(["make", "demo", "test", "bench"]) is None
    assert check_command([".venv/bin/mmfront", "bench", "--only", "hashing", "--quick"]) is None
    assert check_command(["python", "-m", "pytest", "tests/test_cli.py", "-q"]) is None
    assert check_command(["mmfront", "--version"]) is None  # runs it


def test_unknown_fixture_fails_naming_the_known_ones(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    block = Block(REPO / "x.md", 1, "python", "x = 1\n", ("nope",))
    with pytest.raises(pytest.fail.Exception, match=r"unknown docs fixture 'nope'; known: \['gemma3', 'idefics3', 'media', 'web'\]"):
        run_python(block, _FileRun(tmp_path), request)


def test_web_fixture_serves_example_com_only(docs_web: dict[str, Any]) -> None:
    from mmfront.config import MultiModalConfig
    from mmfront.errors import MediaFetchError
    from mmfront.media import DecodeBudget, MediaConnector

    config = MultiModalConfig(allowed_media_domains=("example.com", "other.test"))
    connector = MediaConnector(config)
    image = connector.load_image("https://example.com/cat.jpg", budget=DecodeBudget.from_config(config))
    assert image.info["format"] == "JPEG" and (image.info["width"], image.info["height"]) == (640, 480)
    with pytest.raises(MediaFetchError, match="HTTP 404"):
        connector.fetch_bytes("https://example.com/cat.txt", timeout=1.0)
    with pytest.raises(MediaFetchError, match=r"other\.test is not served offline"):
        connector.fetch_bytes("https://other.test/cat.png", timeout=1.0)


def test_a_block_s_registration_stays_in_its_file(tmp_path: Path) -> None:
    """docs/processing.md registers a processor for ``LlavaProcessor``; once its file's blocks are
    done, ``create_processor`` builds the real one again (a leak gave LLaVA 65 tokens, not 256, to
    every later test in the worker)."""
    from mmfront.models import BaseProcessingInfo, register_processor
    from mmfront.models.catalog import native_factory
    from mmfront.processing import BaseMultiModalProcessor

    before = native_factory("LlavaProcessor", "llava")
    run = _FileRun(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        for (module, name), table in run.catalogs.items():
            patch.setattr(module, name, table)

        @register_processor("LlavaProcessor", info=BaseProcessingInfo, model_types=("llava",))
        class PageExample(BaseMultiModalProcessor):
            pass

        assert native_factory("LlavaProcessor", "llava") is not before
    assert native_factory("LlavaProcessor", "llava") is before
