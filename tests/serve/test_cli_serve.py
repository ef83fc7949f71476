"""``mmfront serve``'s command line: every flag lands in its one home (``MultiModalConfig``,
``DataParallelConfig``, ``ServeSettings``, the launcher's plan), a ``vllm serve`` flag it does not
take is refused by name (engine-only ones pointing at the engines' command line), a bad value
ends with exit status 2 and a message, and parsing imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmfront.cli import build_parser, main
from mmfront.config import ModalityLimit
from mmfront.errors import ConfigError
from mmfront.flags import human_int
from mmfront.serve.args import plan_from_args
from mmfront.serve.launcher import worker_command
from mmfront.serve.settings import DEFAULT_MAX_BODY_BYTES, LocalEngineOptions, ServePlan
from mmfront.serve.vllm_engine import vllm_cli
from mmfront.serve.vllm_flags import ENGINE_FLAGS, PLACED_BY_THE_LAUNCHER
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python


def plan(tmp_path: Path, *flags: str) -> ServePlan:
    return plan_from_args(build_parser().parse_args(["serve", str(tmp_path), *flags]))


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_the_defaults_are_vllms(tmp_path: Path) -> None:
    p = plan(tmp_path)
    s = p.settings
    assert (s.model, s.host, s.port, s.api_key, s.served_model_name, s.model_names) == (
        str(tmp_path), "0.0.0.0", 8000, None, (), (str(tmp_path),))
    assert (s.max_body_bytes, s.uvicorn_log_level, s.api_server_count, s.max_logprobs) == (
        DEFAULT_MAX_BODY_BYTES, "info", 1, 20)
    c = p.config
    assert (c.max_model_len, c.chat_template, c.dtype, c.enable_prefix_caching) == (None, None, "auto", True)
    assert (c.mm_processor_cache_gb, c.mm_processor_cache_type, c.mm_hasher_algorithm) == (4.0, "lru", "blake3")
    assert (c.limit_mm_per_prompt, c.mm_processor_kwargs, c.allowed_local_media_path, c.allowed_media_domains) == (
        {}, None, None, None)
    assert c.mm_processing_lanes is None  # the serving default: in place where mmfront's kernels run, else cores - 1
    d = p.parallel
    assert (d.data_parallel_size, d.data_parallel_size_local, d.data_parallel_address, d.data_parallel_rpc_port) == (
        1, 1, "127.0.0.1", 29550)
    assert p.engine == engines_found(tmp_path) and (p.engine_ready_timeout_s, p.engine_timeout_s) == (600.0, 30.0)


def test_every_http_flag_lands_in_the_serve_settings(tmp_path: Path) -> None:
    p = plan(tmp_path, "--host", "127.0.0.1", "--port", "9001", "--served-model-name", "gemma", "g3",
             "--api-key", "sk-1", "--uvicorn-log-level", "warning", "--max-model-len", "2k",
             "--max-body-bytes", "1024", "--api-server-count", "2", "--max-logprobs", "5")
    s = p.settings
    assert (s.host, s.port, s.served_model_name, s.model_names, s.api_key) == (
        "127.0.0.1", 9001, ("gemma", "g3"), ("gemma", "g3"), "sk-1")
    assert (s.uvicorn_log_level, s.max_body_bytes, s.api_server_count, s.max_logprobs) == ("warning", 1024, 2, 5)
    assert p.config.max_model_len == 2000  # its one home: the processing configuration


def test_every_processing_flag_lands_in_the_multimodal_config(tmp_path: Path) -> None:
    media = tmp_path / "media"
    media.mkdir()
    c = plan(tmp_path, "--limit-mm-per-prompt", '{"image": 2, "audio": {"count": 1}}',
             "--mm-processor-kwargs", '{"do_pan_and_scan": true}',
             "--media-io-kwargs", '{"image": {"rgba_background_color": [0, 0, 0]}}',
             "--mm-processor-cache-gb", "0.5", "--mm-processor-cache-type", "shm",
             "--mm-shm-cache-max-object-size-mb", "16", "--mm-hasher-algorithm", "sha256", "--enable-mm-embeds",
             "--disable-prefix-caching", "--enable-tower-connector-lora", "--dtype", "float32",
             "--chat-template", "{{ messages }}", "--chat-template-content-format", "string",
             "--trust-request-chat-template", "--allowed-local-media-path", str(media),
             "--allowed-media-domains", "Example.com", "*.cdn.net", "--processing-lanes", "0",
             "--lane-executor", "ray", "--thread-budget", "3", "--transformers-backend", "legacy",
             "--max-model-len", "512").config
    assert c.limit_mm_per_prompt == {"image": ModalityLimit(2), "audio": ModalityLimit(1)}
    assert c.mm_processor_kwargs == {"do_pan_and_scan": True}
    assert c.media_io_kwargs == {"image": {"rgba_background_color": [0, 0, 0]}}
    assert (c.mm_processor_cache_gb, c.mm_processor_cache_type, c.mm_shm_cache_max_object_size_mb) == (0.5, "shm", 16)
    assert (c.mm_hasher_algorithm, c.enable_mm_embeds, c.enable_prefix_caching) == ("sha256", True, False)
    assert (c.enable_tower_connector_lora, c.dtype, c.max_model_len) == (True, "float32", 512)
    assert (c.chat_template, c.chat_template_content_format, c.trust_request_chat_template) == (
        "{{ messages }}", "string", True)
    assert (c.allowed_local_media_path, c.allowed_media_domains) == (str(media), ("example.com", "*.cdn.net"))
    assert (c.mm_processing_lanes, c.mm_lane_executor, c.mm_thread_budget, c.transformers_backend) == (
        0, "ray", 3, "legacy")


def test_prefix_caching_is_on_unless_disabled(tmp_path: Path) -> None:
    assert plan(tmp_path, "--enable-prefix-caching").config.enable_prefix_caching
    assert not plan(tmp_path, "--disable-prefix-caching").config.enable_prefix_caching


def engines_found(model: Path, **options: str) -> LocalEngineOptions:
    """The local engines' options by default: vLLM's where it is found (given MODEL as typed)."""
    cli = vllm_cli()
    return LocalEngineOptions(engine="vllm" if cli else "mmfront", vllm_cli=cli or (),
                              vllm_args=(str(model),) if cli else (), **options)  # type: ignore[arg-type]


def test_a_chat_template_file_is_read(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    p = plan(tmp_path, "--chat-template", str(template))
    assert p.config.chat_template == template.read_text()


def test_every_engine_flag_lands_in_the_data_parallel_config_and_the_plan(tmp_path: Path) -> None:
    p = plan(tmp_path, "--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-address",
             "10.0.0.5", "--data-parallel-rpc-port", "13345", "--engine-ready-timeout", "90", "--engine-timeout", "5",
             "--worker-device", "cpu", "--dtype", "bfloat16")
    d = p.parallel
    assert (d.data_parallel_size, d.data_parallel_size_local, d.data_parallel_address, d.data_parallel_rpc_port) == (
        4, 2, "10.0.0.5", 13345)
    assert p.engine == engines_found(tmp_path, device="cpu", dtype="bfloat16")
    assert (p.engine_ready_timeout_s, p.engine_timeout_s) == (90.0, 5.0)


def test_vllms_short_forms_are_taken(tmp_path: Path) -> None:
    d = plan(tmp_path, "-dp", "2", "-dpl", "0", "-dpa", "0.0.0.0", "-dpp", "1", "-asc", "1").parallel
    assert (d.data_parallel_size, d.data_parallel_size_local, d.data_parallel_address, d.data_parallel_rpc_port) == (
        2, 0, "0.0.0.0", 1)


def test_all_ranks_are_local_unless_said_otherwise(tmp_path: Path) -> None:
    assert plan(tmp_path, "-dp", "3").parallel.data_parallel_size_local == 3
    assert plan(tmp_path, "-dpl", "0").parallel.all_local is False


@pytest.mark.parametrize(("text", "value"), [("8192", 8192), ("8k", 8000), ("8K", 8192), ("1.5k", 1500),
                                             ("2M", 2 << 20), ("1g", 10**9)])
def test_max_model_len_reads_vllms_suffixes(text: str, value: int) -> None:
    assert human_int(text) == value


@pytest.mark.parametrize("flag", ["--tensor-parallel-size", "-tp", "--gpu-memory-utilization", "--pipeline-parallel-size",
                                  "--enforce-eager", "--kv-cache-dtype", "--block-size", "--max-num-seqs",
                                  "--max-num-batched-tokens", "--quantization", "--seed"])
def test_engine_only_flags_are_refused_pointing_at_the_engines_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    err = refused(capsys, str(tmp_path), flag, "2")
    assert f"{flag} configures the engine" in err and "vllm serve MODEL --headless" in err


def test_every_refused_flag_is_named_in_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "--gpu-memory-utilization=0.5", str(tmp_path), "-tp", "2", "--frobnicate", "bot",
                  "--headless", "--lora-modules", "a=b")
    assert "--gpu-memory-utilization configures the engine" in err and "-tp configures the engine" in err
    assert "--frobnicate is not supported by mmfront serve" in err
    assert "--lora-modules is not taken by mmfront serve: mmfront serves the base model only" in err
    assert "--headless starts engines without an API server" in err and "--data-parallel-size-local 0" in err


def test_an_abbreviation_is_not_taken_for_a_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--max-model is not supported" in refused(capsys, str(tmp_path), "--max-model", "10")


def test_other_commands_keep_argparses_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--frobnicate"])
    assert exc.value.code == 2 and "unrecognized arguments: --frobnicate" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--limit-mm-per-prompt", "{image: 2}", "--limit-mm-per-prompt takes a JSON object"),
    ("--limit-mm-per-prompt", "[2]", "got '[2]'"),
    ("--mm-processor-kwargs", "not json", "--mm-processor-kwargs takes a JSON object"),
    ("--media-io-kwargs", "3", "--media-io-kwargs takes a JSON object"),
    ("--max-model-len", "8x", "expected a whole number such as 32768"),
    ("--max-model-len", "1.5", "not a whole number of tokens"),
    ("--port", "70000", "expected a port number"),
    ("--port", "http", "expected a whole number >= 0"),
    ("--api-server-count", "0", "expected a whole number >= 1"),
    ("--data-parallel-size", "-1", "expected a whole number >= 1"),
    ("--processing-lanes", "-1", "expected a whole number >= 0"),
    ("--engine-timeout", "0", "seconds > 0"),
    ("--engine-ready-timeout", "soon", "a number of seconds"),
    ("--mm-processor-cache-gb", "lots", "invalid float value"),
    ("--mm-processor-cache-type", "disk", "invalid choice"),
    ("--uvicorn-log-level", "loud", "invalid choice"),
])
def test_a_bad_value_exits_2_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                             value: str, message: str) -> None:
    err = refused(capsys, str(tmp_path), flag, value)
    assert f"argument {flag}" in err and message in err, err


@pytest.mark.parametrize(("flags", "message"), [
    (["--limit-mm-per-prompt", '{"smell": 1}'], "unknown modalities 'smell'"),
    (["--limit-mm-per-prompt", '{"image": -1}'], "non-negative integer"),
    (["--mm-processor-cache-gb", "-1"], "mm_processor_cache_gb must be a finite number >= 0"),
    (["--allowed-local-media-path", "relative/dir"], "allowed_local_media_path must be an existing absolute directory"),
    (["--api-key", "a", "b"], "--api-key takes one key"),
    (["-dp", "2", "-dpl", "3"], "data_parallel_size_local must be in [0, data_parallel_size=2]"),
    (["-dp", "2", "-dpl", "1", "--mm-processor-cache-type", "shm"], "shm serves one engine on this host from one"),
    (["-dp", "2", "--mm-processor-cache-type", "shm"], "lru keeps one mirror per rank"),
    (["--api-server-count", "2", "--mm-processor-cache-type", "shm"], "lru keeps one mirror per rank and API"),
    (["--enable-per-request-metrics", "--disable-log-stats"],
     "--enable-per-request-metrics requires engine statistics logging; remove --disable-log-stats"),
])
def test_a_value_the_configuration_refuses_exits_2_with_its_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=None):
        plan(tmp_path, *flags)
    assert main(["serve", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mmfront serve: ") and message in err, err


def test_a_model_that_is_neither_a_folder_nor_a_hub_id_exits_2(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path / "org/model")]) == 2
    assert capsys.readouterr().err.startswith(
        f"mmfront serve: MODEL '{tmp_path / 'org/model'}' is neither a folder nor a hub id (ORG/NAME): ")


def test_the_worker_command_meets_every_api_server_through_its_handshake_with_its_cache(tmp_path: Path) -> None:
    p = plan(tmp_path, "--mm-processor-cache-gb", "0.25", "--mm-processor-cache-type", "shm", "--worker-device", "cpu",
             "--dtype", "float16")
    command = worker_command(tmp_path, 3, ["ipc://a/handshake", "ipc://b/handshake"], p.config, p.engine,
                             shm_names=["seg-a", "seg-b"])
    assert command[:4] == [sys.executable, "-m", "mmfront.cli", "worker"]
    args = build_parser().parse_args(command[3:])
    assert (args.model, args.handshake, args.local, args.engine_index) == (
        str(tmp_path), ["ipc://a/handshake", "ipc://b/handshake"], True, 3)
    assert (args.cache, args.cache_gb, args.shm_name, args.device, args.dtype) == ("shm", 0.25, ["seg-a", "seg-b"],
                                                                                   "cpu", "float16")
    plain = build_parser().parse_args(worker_command(tmp_path, 0, ["ipc://h"], plan(tmp_path).config,
                                                     LocalEngineOptions())[3:])
    assert (plain.cache, plain.cache_gb, plain.shm_name, plain.device, plain.dtype) == ("lru", 4.0, None, None, None)


def test_serve_help_names_the_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in ["--host", "--port", "--served-model-name", "--api-key", "--max-model-len", "--limit-mm-per-prompt",
                 "--mm-processor-cache-gb", "--mm-processor-cache-type", "--mm-processor-kwargs", "--chat-template",
                 "--allowed-local-media-path", "--allowed-media-domains", "--api-server-count",
                 "--data-parallel-size", "--data-parallel-size-local", "--data-parallel-address",
                 "--data-parallel-rpc-port", "--uvicorn-log-level", "--processing-lanes"]:
        assert flag in text


HEAVY = ("torch", "transformers", "numpy", "PIL", "zmq", "uvicorn", "starlette")
_PARSE_ONLY = textwrap.dedent("""
    import json, sys
    from mmfront.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
    print(json.dumps([code, sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})]))
""")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["serve", "--help"], ["worker", "--help"],
                                  ["demo", "--help"], ["bench", "--help"], ["serve", "/m", "-tp", "2"]])
def test_parsing_imports_nothing_heavy(argv: list[str]) -> None:
    """What makes ``mmfront --help`` answer at once: torch alone takes seconds to import."""
    done = subprocess.run([sys.executable, "-c", _PARSE_ONLY.format(heavy=HEAVY), *argv], capture_output=True,
                          text=True, timeout=120, check=True)
    code, heavy = json.loads(done.stdout.splitlines()[-1])
    assert code in (0, 2) and heavy == [], heavy


def test_import_mmfront_is_light_and_its_names_load_on_use() -> None:
    check = ("import sys, mmfront; light = 'torch' not in sys.modules; "
             "from mmfront import InputPreprocessor, SamplingParams; "
             "print(light, InputPreprocessor.__module__, 'torch' in sys.modules, 'SamplingParams' in dir(mmfront))")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "mmfront.preprocess.preprocessor", "True", "True"]


def test_an_unknown_name_of_the_package_is_an_attribute_error() -> None:
    import mmfront

    with pytest.raises(AttributeError, match="no attribute 'InputPreprocesor'"):
        mmfront.InputPreprocesor  # noqa: B018


PEER = vllm_peer_python()


@pytest.mark.slow
@pytest.mark.skipif(PEER is None, reason=SKIP_REASON)
def test_the_engine_flags_are_vllm_serve_flags_with_vllms_arity() -> None:
    """Each name in the routing table is one ``vllm serve`` takes, with as many values as vLLM's own
    parser reads (0: a switch, 1, or "+")."""
    read = ("from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "from vllm.entrypoints.common.cli_args import make_arg_parser\n"
            "import json\n"
            "print(json.dumps({o: 0 if a.nargs == 0 else 1 if a.nargs is None else a.nargs "
            "for a in make_arg_parser(FlexibleArgumentParser())._actions for o in a.option_strings}))")
    assert PEER is not None
    done = subprocess.run([str(PEER), "-c", read], capture_output=True, text=True, timeout=300, check=True,
                          env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    vllms = json.loads(done.stdout.splitlines()[-1])
    assert {name: vllms.get(name) for name in ENGINE_FLAGS} == ENGINE_FLAGS
    assert set(vllms) >= PLACED_BY_THE_LAUNCHER
