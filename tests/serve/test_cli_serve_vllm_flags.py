"""``mmfront serve`` takes every option of ``vllm serve``'s API-server group with vLLM's meaning,
or refuses it by name with the reason (docs/serving.md, "Differences from vllm serve"); the list
is read from vLLM's own parser in the peer venv where it exists (tests/serve/vllm_api_server_flags.py
holds it for CI). And the command line is read as vLLM's ``FlexibleArgumentParser`` reads it:
``--config FILE.yaml``, ``--snake_case`` names, dotted options (``--limit-mm-per-prompt.image 4``),
each boolean's counterpart (``--no-...``, ``--disable-...``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_api_server_flags import FRONTEND_FLAGS, PEER_SCRIPT, SERVER_FLAGS

from mmfront.cli import main
from mmfront.config import MultiModalConfig
from mmfront.flags import counterpart, expand_argv
from mmfront.models.registry import create_processor
from mmfront.serve.args import add_serve_parser, plan_from_args, serve_argv
from mmfront.serve.vllm_flags import NOT_TAKEN_FRONTEND_FLAGS, refusal
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python


def serve_parser() -> argparse.ArgumentParser:
    return add_serve_parser(argparse.ArgumentParser(prog="mmfront").add_subparsers())


def test_the_checked_in_lists_are_vllms() -> None:
    python = vllm_peer_python()
    if python is None:
        pytest.skip(SKIP_REASON)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    found = subprocess.run([str(python), "-c", PEER_SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                           check=True)
    lists = json.loads(found.stdout.strip().splitlines()[-1])
    assert tuple(lists["frontend"]) == FRONTEND_FLAGS
    assert tuple(lists["server"]) == SERVER_FLAGS


@pytest.mark.parametrize("option", FRONTEND_FLAGS + SERVER_FLAGS)
def test_every_api_server_flag_is_taken_or_refused_with_its_reason(option: str) -> None:
    taken = serve_parser()._option_string_actions
    if option == "--config":  # read before parsing, as vLLM's parser does
        assert option in taken
    elif option in NOT_TAKEN_FRONTEND_FLAGS:
        assert option not in taken
        assert refusal(option) == f"{option} is not taken by mmfront serve: {NOT_TAKEN_FRONTEND_FLAGS[option]}."
    else:
        assert option in taken, f"mmfront serve does not take {option}"


def test_refused_flags_are_few() -> None:
    """The flags refused for good configure routes or deployments mmfront does not have."""
    assert len({counterpart(f) if f.startswith(("--no-", "--disable-")) else f for f in NOT_TAKEN_FRONTEND_FLAGS}) == 14


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmfront")
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(serve_argv(["serve", *argv]))


def test_config_yaml_as_vllm_reads_it(tmp_path: Path) -> None:
    """vLLM's test_config_file: the file's options, then the command line's (which win); ``true``
    a flag, ``false`` its ``--no-`` form where there is one, a list several values, a mapping JSON."""
    config = tmp_path / "serve.yaml"
    config.write_text("port: 12312\nserved-model-name: [a, b]\ntrust-remote-code: true\n"
                      "enable-request-id-headers: false\nlimit-mm-per-prompt:\n  image: 3\n"
                      "allowed-origins: '[\"https://app.example\"]'\nmax_log_len: 7\n", encoding="utf-8")
    args = parse(str(tmp_path), "--config", str(config), "--port", "9000")
    assert (args.port, args.served_model_name, args.trust_remote_code, args.enable_request_id_headers) == (
        9000, ["a", "b"], True, False)
    assert (args.limit_mm_per_prompt, args.allowed_origins, args.max_log_len) == ({"image": 3}, ("https://app.example",), 7)
    assert expand_argv(["serve", "--config", str(config)], {"--no-trust-remote-code"})[:3] == ["serve", "--port", "12312"]
    model = tmp_path / "m.yaml"
    model.write_text(f"model: {tmp_path}\nport: 1234\n", encoding="utf-8")
    assert parse("--config", str(model)).model == str(tmp_path)


@pytest.mark.parametrize(("text", "message"), [
    ("port: [", "is not valid YAML"), ("- a\n- b\n", "must hold a mapping"),
])
def test_a_bad_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                      message: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(tmp_path), "--config", str(config)])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path), "--config", str(tmp_path / "serve.json")])
    assert "--config takes a YAML file" in capsys.readouterr().err


def test_dotted_and_snake_case_options(tmp_path: Path) -> None:
    """vLLM's test_dict_args: dotted keys gather into one JSON object per option, values read as
    JSON (else a size, else text); ``+`` makes a comma list; underscores read as dashes."""
    assert expand_argv(["--limit-mm-per-prompt.image", "4", "--limit-mm-per-prompt.video=1", "--a.b.c", "2k",
                        "--a.b.d", "text", "--a.l+", "x,y", "--max_model_len", "10"], set()) == [
        "--max-model-len", "10", "--limit-mm-per-prompt", '{"image": 4, "video": 1}',
        "--a", '{"b": {"c": 2000, "d": "text"}, "l": ["x", "y"]}']
    args = parse(str(tmp_path), "--limit-mm-per-prompt.image", "4", "--mm_processor_cache_gb", "2")
    assert (args.limit_mm_per_prompt, args.mm_processor_cache_gb) == ({"image": 4}, 2.0)


def test_every_boolean_has_its_counterpart(tmp_path: Path) -> None:
    assert [counterpart(f) for f in ("--enable-x", "--disable-x", "--trust-x", "--no-trust-x")] == [
        "--disable-x", "--enable-x", "--no-trust-x", "--trust-x"]
    args = parse(str(tmp_path), "--enable-log-requests", "--disable-log-requests", "--no-trust-remote-code",
                 "--enable-uvicorn-access-log", "--no-allow-credentials")
    assert (args.enable_log_requests, args.trust_remote_code, args.disable_uvicorn_access_log,
            args.allow_credentials) == (False, False, False, False)


def test_http_flags_reach_the_settings(tmp_path: Path) -> None:
    plan = plan_from_args(parse(
        str(tmp_path), "--allowed-origins", '["https://a.example"]', "--allowed-methods", '["GET"]',
        "--allow-credentials", "--middleware", "a.b", "--middleware", "c.d", "--root-path", "/llm",
        "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--ssl-cert-reqs", "2", "--uds", "/tmp/s",
        "--enable-request-id-headers", "--disable-fastapi-docs", "--response-role", "model",
        "--enable-force-include-usage", "--enable-tokenizer-info-endpoint", "--return-tokens-as-token-ids",
        "--max-log-len", "9", "--enable-log-requests", "--disable-uvicorn-access-log",
        "--disable-access-log-for-endpoints", "/health,/metrics", "--tokenizer", str(tmp_path), "--trust-remote-code"))
    s = plan.settings
    assert (s.allowed_origins, s.allowed_methods, s.allowed_headers, s.allow_credentials) == (
        ("https://a.example",), ("GET",), ("*",), True)
    assert (s.middleware, s.root_path, s.ssl_keyfile, s.ssl_certfile, s.ssl_cert_reqs, s.uds) == (
        ("a.b", "c.d"), "/llm", "k.pem", "c.pem", 2, "/tmp/s")
    assert (s.enable_request_id_headers, s.disable_fastapi_docs, s.response_role, s.enable_force_include_usage,
            s.enable_tokenizer_info_endpoint, s.return_tokens_as_token_ids, s.max_log_len, s.enable_log_requests,
            s.disable_uvicorn_access_log, s.disable_access_log_for_endpoints) == (
        True, True, "model", True, True, True, 9, True, True, "/health,/metrics")
    assert (plan.config.tokenizer, plan.config.trust_remote_code) == (str(tmp_path), True)


def test_the_tool_and_reasoning_flags_as_vllm_reads_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = plan_from_args(parse(str(tmp_path), "--tool-strict-level", "parameter", "--reasoning-effort-map",
                                    '{"medium": "low"}')).settings
    assert (settings.tool_strict_level, settings.reasoning_effort_map) == ("parameter", {"medium": "low"})
    assert plan_from_args(parse(str(tmp_path), "--reasoning-effort-map.xhigh", "max")).settings.reasoning_effort_map \
        == {"xhigh": "max"}
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(tmp_path), "--tool-strict-level", "strict"])
    assert exc.value.code == 2 and "--tool-strict-level" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--reasoning-effort-map", '{"huge": "max"}']) == 2
    assert "--reasoning-effort-map has unknown efforts ['huge']" in capsys.readouterr().err


def test_cors_lists_take_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path), "--allowed-origins", "https://a.example"])
    assert "--allowed-origins takes a JSON list" in capsys.readouterr().err


def test_tokenizer_from_another_folder(gemma3_dir: Path, tmp_path: Path) -> None:
    """``--tokenizer DIR``: the processor tokenizes with DIR's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gemma3_dir), local_files_only=True)
    tokenizer.add_tokens(["<mmfront-extra>"])
    tokenizer.save_pretrained(str(tmp_path))
    plain = create_processor(gemma3_dir, MultiModalConfig())
    other = create_processor(gemma3_dir, MultiModalConfig(tokenizer=str(tmp_path)))
    assert len(other.info.get_tokenizer()) == len(plain.info.get_tokenizer()) + 1
    assert other.info.get_tokenizer().convert_tokens_to_ids("<mmfront-extra>") == len(plain.info.get_tokenizer())


def test_uvicorn_takes_the_http_flags(tmp_path: Path) -> None:
    import logging

    from mmfront.serve.launcher import AccessLogFilter, uvicorn_config
    from mmfront.serve.settings import ServeSettings

    settings = ServeSettings(tmp_path, uds=str(tmp_path / "s.sock"), ssl_keyfile="k.pem", ssl_certfile="c.pem",
                             ssl_ca_certs="ca.pem", ssl_cert_reqs=2, ssl_ciphers="ECDHE-RSA-AES256-GCM-SHA384",
                             disable_uvicorn_access_log=True, h11_max_incomplete_event_size=1024,
                             h11_max_header_count=12, disable_access_log_for_endpoints="/health, /metrics")
    config = uvicorn_config(object(), settings)
    assert (config.uds, config.ssl_keyfile, config.ssl_certfile, config.ssl_ca_certs, config.ssl_cert_reqs,
            config.ssl_ciphers, config.access_log) == (
        str(tmp_path / "s.sock"), "k.pem", "c.pem", "ca.pem", 2, "ECDHE-RSA-AES256-GCM-SHA384", False)
    limits = config.http.keywords["limits"]  # the head bounds, on mmfront's connection (tests/hardening/test_http_front_door.py)
    assert (limits.max_head_bytes, limits.max_header_count) == (1024, 12)
    quiet = [f for f in logging.getLogger("uvicorn.access").filters if isinstance(f, AccessLogFilter)]
    try:
        assert quiet[-1].paths == frozenset({"/health", "/metrics"})

        def record(path: str) -> logging.LogRecord:
            return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                                     ("1.2.3.4:5", "GET", path, "1.1", 200), None)

        assert not quiet[-1].filter(record("/health?x=1")) and quiet[-1].filter(record("/v1/models"))
    finally:
        for f in quiet:
            logging.getLogger("uvicorn.access").removeFilter(f)


def test_tls_with_the_ssl_flags(tmp_path: Path) -> None:
    """``--ssl-keyfile`` and ``--ssl-certfile``: the app answers over HTTPS (a self-signed certificate)."""
    import shutil
    import threading
    import time

    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from mmfront.network import get_open_port
    from mmfront.serve.launcher import uvicorn_config
    from mmfront.serve.settings import ServeSettings

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("secure")

    port = get_open_port()
    settings = ServeSettings(tmp_path, host="127.0.0.1", port=port, ssl_keyfile=str(key), ssl_certfile=str(cert))
    server = uvicorn.Server(uvicorn_config(Starlette(routes=[Route("/", hello)]), settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        assert httpx.get(f"https://127.0.0.1:{port}/", verify=str(cert)).text == "secure"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
    finally:
        server.should_exit = True
        thread.join(30)
