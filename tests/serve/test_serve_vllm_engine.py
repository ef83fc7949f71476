"""``mmfront serve --engine vllm``: vLLM's own engine cores as the local engines. The command line
is routed as ``vllm serve`` applies it (engine flags to the engines, the processing flags to both,
each as typed), the engines are ``vllm serve MODEL --headless`` processes, one per rank; and, where
the vLLM 0.33 peer venv exists (``vllm_side_by_side``; skipped in CI with the reason), the literal
``vllm serve`` command line of a deployment, with the stub executor of ``../shared/peer`` as its
``--distributed-executor-backend``, serves image chats through the stock engine core it started,
stops it on SIGTERM, and logs its death with its rank and exit status."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mmfront.cli import main
from mmfront.network import get_open_port
from mmfront.serve.args import plan_from_args, route_serve_argv
from mmfront.serve.launcher import engine_commands, engine_kind, handshake_parallel
from mmfront.serve.vllm_engine import VLLM_CLI_CODE, script_python, vllm_cli
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python

PEER = vllm_peer_python()
PEER_MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
PEER_DIR = Path(__file__).resolve().parents[3] / "shared" / "peer"
NO_PEER = PEER is None or PEER_MODEL is None or not PEER_DIR.is_dir()

LITERAL = ["--max-model-len", "8192", "--limit-mm-per-prompt", '{"image":4}', "--gpu-memory-utilization", "0.9",
           "--tensor-parallel-size", "1", "--distributed-executor-backend", "stub_executor.StubExecutor"]
"""The issue's ``vllm serve`` command line, with the stub executor's flag added."""
IDLE_STOP_S = 2.0
"""How soon an idle server stops on SIGTERM, engines included (``vllm serve``: 0.9-1.9 s here)."""


def parsed(argv: list[str]) -> argparse.Namespace:
    """``mmfront serve``'s arguments as :func:`mmfront.cli.main` parses and routes them."""
    from mmfront.cli import build_parser
    from mmfront.serve.args import serve_argv

    routed = route_serve_argv(serve_argv(["serve", *argv]))
    args, extras = build_parser().parse_known_args(routed.frontend)
    assert not extras
    args.engine_args, args.engine_flags = routed.engine, routed.engine_flags
    return args


def test_the_command_line_is_routed_as_vllm_serve_applies_it() -> None:
    routed = route_serve_argv(["serve", "Org/model", "--port", "8000", *LITERAL, "--enforce-eager",
                               "--cudagraph-capture-sizes", "1", "2", "--served-model-name", "m", "--api-key", "k",
                               "--seed=-3", "--engine", "vllm"])
    assert routed.frontend == ["serve", "Org/model", "--port", "8000", "--max-model-len", "8192",
                               "--limit-mm-per-prompt", '{"image":4}', "--served-model-name", "m", "--api-key", "k",
                               "--engine", "vllm"]
    assert routed.engine == ["Org/model", "--max-model-len", "8192", "--limit-mm-per-prompt", '{"image":4}',
                             "--gpu-memory-utilization", "0.9", "--tensor-parallel-size", "1",
                             "--distributed-executor-backend", "stub_executor.StubExecutor", "--enforce-eager",
                             "--cudagraph-capture-sizes", "1", "2", "--served-model-name", "m", "--seed=-3"]
    assert routed.engine_flags == ["--gpu-memory-utilization", "--tensor-parallel-size",
                                   "--distributed-executor-backend", "--enforce-eager", "--cudagraph-capture-sizes",
                                   "--seed"]


def fake_vllm(tmp_path: Path) -> Path:
    cli = tmp_path / "bin" / "vllm"
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\nexit 3\n")
    cli.chmod(0o755)
    return cli


def test_each_local_rank_is_a_headless_vllm_serve_greeting_a_tcp_handshake(gemma3_dir: Path, tmp_path: Path) -> None:
    cli = fake_vllm(tmp_path)
    plan = plan_from_args(parsed([str(gemma3_dir), "--vllm-command", str(cli), "-dp", "2", "--max-model-len", "64",
                                  "--gpu-memory-utilization", "0.5"]))
    assert (plan.engine.engine, plan.engine.vllm_cli) == ("vllm", (str(cli),))
    assert engine_kind(plan) == "vLLM engine core ('vllm serve --headless')"
    parallel = handshake_parallel(plan)
    assert (parallel.data_parallel_size, parallel.local_ranks, parallel.data_parallel_rpc_port) == (2, 0, 0)
    assert engine_commands(plan, "tcp://127.0.0.1:4567", [None]) == [
        [str(cli), "serve", str(gemma3_dir), "--max-model-len", "64", "--gpu-memory-utilization", "0.5", "--headless",
         "--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-start-rank", str(rank),
         "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", "4567"] for rank in (0, 1)]


def test_a_python_is_run_with_vllms_cli_code(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text("")
    assert vllm_cli(str(python)) == (str(python), "-c", VLLM_CLI_CODE)


def test_a_scripts_python_is_read_from_its_first_lines(tmp_path: Path) -> None:
    python = tmp_path / "a venv" / "bin" / "python3.11"
    python.parent.mkdir(parents=True)
    python.write_text("")
    direct, long, other, missing = (tmp_path / name for name in ("direct", "long", "other", "missing"))
    direct.write_text(f"#!{tmp_path / 'a' / 'python3'} -E\nimport sys\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "python3").write_text("")
    long.write_text(f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\nimport sys\n")  # pip's form for long paths
    other.write_text("#!/bin/sh\nexit 3\n")
    missing.write_text("#!/nowhere/python3\n")
    assert script_python(str(direct)) == str(tmp_path / "a" / "python3")
    assert script_python(str(long)) == str(python)
    assert (script_python(str(other)), script_python(str(missing)), script_python(str(tmp_path / "none"))) == (None,) * 3
    assert vllm_cli(str(long)) == (str(python), "-c", VLLM_CLI_CODE)
    assert vllm_cli(str(other)) == (str(other),)


@pytest.mark.parametrize(("body", "status", "said"), [
    ("print('served')", 0, "served"),
    ("raise SystemExit(3)", 3, ""),
    ("raise SystemExit('vllm: bad flag')", 1, "vllm: bad flag"),
    ("raise ValueError('no model')", 1, "ValueError: no model"),
])
def test_vllms_cli_runs_then_ends_the_process_after_its_atexit_handlers(tmp_path: Path, body: str, status: int,
                                                                        said: str) -> None:
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (cli.parent.parent, cli.parent, cli):
        (folder / "__init__.py").write_text("")
    (cli / "main.py").write_text(f"import atexit, sys\n\n\ndef main():\n    atexit.register(print, 'atexit ran', sys.argv)\n"
                                 f"    {body}\n")
    ended = subprocess.run([sys.executable, "-c", VLLM_CLI_CODE, "serve", "m", "--headless"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, check=False,
                           env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert ended.returncode == status, ended.stderr
    assert said in ended.stdout + ended.stderr
    assert "atexit ran ['vllm', 'serve', 'm', '--headless']" in ended.stdout


def test_engine_vllm_without_vllm_is_refused(gemma3_dir: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    if vllm_cli() is not None:
        pytest.skip("vLLM is importable in this environment")
    assert main(["serve", str(gemma3_dir), "--engine", "vllm"]) == 2
    assert "--engine vllm: vLLM is not found" in capsys.readouterr().err


def test_engine_flags_are_refused_for_the_reference_engine(gemma3_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["serve", str(gemma3_dir), "--engine", "mmfront", "--gpu-memory-utilization", "0.9"])
    assert ended.value.code == 2
    assert ("--gpu-memory-utilization configures the engine, not the API server: mmfront serve hands it to the vLLM "
            "engines it starts (--engine vllm), and here it starts mmfront's reference engine (--engine mmfront)"
            ) in capsys.readouterr().err


def test_engine_flags_are_refused_without_local_engines(gemma3_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", str(gemma3_dir), "--vllm-command", str(fake_vllm(tmp_path)), "-dpl", "0", "-tp", "2"])
    assert "-tp configures the engine" in capsys.readouterr().err


def health(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


@dataclass
class Server:
    """``mmfront serve`` on the peer's model, started healthy with vLLM's engine, as a subprocess."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    started_s: float
    """From the command's start to ``/health`` answering 200."""

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def start_server(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> Server:
    """``mmfront serve PEER_MODEL ... flags`` with the peer's stub executors importable (its
    ``PYTHONPATH``) and ``env`` added, without keep-alive, healthy."""
    assert PEER_MODEL is not None
    port = get_open_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", **(env or {}),
           "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(PEER_DIR)])}
    env.pop("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", None)
    log = tmp_path / "serve.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "mmfront.cli", "serve", str(PEER_MODEL), "--host",
                                    "127.0.0.1", "--port", str(port), *flags], stdout=out, stderr=subprocess.STDOUT,
                                   env=env)
    server = Server(process, f"http://127.0.0.1:{port}", log, 0.0)
    try:
        while health(server.url) != 200:
            assert process.poll() is None and time.monotonic() - started < 600, server.tail()
            time.sleep(0.5)
    except BaseException:
        server.close()
        raise
    server.started_s = time.monotonic() - started
    return server


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)
def test_the_vllm_serve_command_line_serves_through_the_vllm_engine_it_starts(tmp_path: Path) -> None:
    assert PEER is not None
    server = start_server(tmp_path, *LITERAL, "--vllm-command", str(PEER.parent / "vllm"))
    try:
        print(f"vLLM engine started and healthy after {server.started_s:.1f} s")
        images = [{"type": "image_url", "image_url": {"url": image_data_url(make_image(40 + 8 * i, 32, seed=i))}}
                  for i in range(2)]
        for count in (1, 2):
            body = {"model": str(PEER_MODEL), "max_tokens": 3, "return_token_ids": True,
                    "messages": [{"role": "user", "content": [*images[:count], {"type": "text", "text": "What?"}]}]}
            answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
            # the stub executor's tokens: 1000 + 10 * (images that reached it with their data) + k
            assert answer["choices"][0]["token_ids"] == [1000 + 10 * count + k for k in range(3)], answer
        text = server.log.read_text(errors="replace")
        assert "engines: 1 local vLLM engine core ('vllm serve --headless')" in text
        assert "Launching 1 data parallel engine(s) in headless mode" in text
        [engine] = headless_children(server.process.pid)
        group = os.getpgid(engine)
        members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == group]
        assert len(members) >= 2  # vllm serve --headless and its engine core
        stop_idle(server, members)
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)
def test_sigterm_with_a_request_in_flight_answers_it_then_stops_the_engine(tmp_path: Path) -> None:
    assert PEER is not None
    server = start_server(tmp_path, "--max-model-len", "4096", "--distributed-executor-backend",
                          "stub_trace.TraceStubExecutor", "--vllm-command", str(PEER.parent / "vllm"),
                          env={"STUB_TRACE_STEP_DELAY_S": "0.1"})
    try:
        members = engine_group(server)
        body = {"model": str(PEER_MODEL), "prompt": "Hello", "max_tokens": 30, "stream": True, "ignore_eos": True,
                "return_token_ids": True}
        tokens: list[int] = []
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as streamed:
            finish = None
            for line in streamed.iter_lines():
                if not line.startswith("data: {"):
                    continue
                [choice] = json.loads(line[len("data: "):])["choices"]
                tokens += choice["token_ids"]
                finish = choice["finish_reason"]
                if len(tokens) == 3:
                    server.process.send_signal(signal.SIGTERM)  # 27 steps of 0.1 s are still to come
        assert (tokens, finish) == ([1000 + k for k in range(30)], "length")
        assert server.process.wait(60) == 0, server.tail()
        assert not [p for p in members if _alive(int(p))], "the engine's process group outlived the server"
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)
def test_the_vllm_engines_death_is_logged_and_stops_the_server(tmp_path: Path) -> None:
    assert PEER is not None
    server = start_server(tmp_path, "--max-model-len", "4096", "--distributed-executor-backend",
                          "stub_executor.StubExecutor", "--vllm-command", str(PEER))
    try:
        [engine] = headless_children(server.process.pid)
        os.kill(engine, signal.SIGKILL)
        assert server.process.wait(60) == 1, server.tail()
    finally:
        server.close()
    assert "Engine rank 0 (vLLM engine core) died: killed by signal 9." in server.log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)
def test_two_ranks_are_two_vllm_engines(tmp_path: Path) -> None:
    assert PEER is not None
    server = start_server(tmp_path, "-dp", "2", "--max-model-len", "4096", "--distributed-executor-backend",
                          "stub_executor.StubExecutor", "--vllm-command", str(PEER.parent / "vllm"))
    try:
        commands = [_cmdline(pid).split(b"\0") for pid in headless_children(server.process.pid)]
        assert sorted(c[c.index(b"--data-parallel-start-rank") + 1] for c in commands) == [b"0", b"1"]
        for i in range(4):  # the least busy rank takes each: both serve
            assert image_chat_tokens(server, seed=i) == [1010, 1011, 1012]
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0, server.tail()
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)
def test_two_api_servers_serve_through_the_vllm_engine_and_stop_within_the_idle_bound(tmp_path: Path) -> None:
    assert PEER is not None
    server = start_server(tmp_path, "--api-server-count", "2", "--max-model-len", "4096",
                          "--distributed-executor-backend", "stub_executor.StubExecutor",
                          "--vllm-command", str(PEER.parent / "vllm"))
    try:
        members = engine_group(server)
        api_servers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == server.process.pid
                       and b"multiprocessing.spawn" in _cmdline(int(p)) and b"resource_tracker" not in _cmdline(int(p))]
        assert len(api_servers) == 2
        for i in range(6):  # new connections, spread over both API servers by the kernel
            assert image_chat_tokens(server, seed=i) == [1010, 1011, 1012]
        stop_idle(server, [*members, *map(str, api_servers)])
    finally:
        server.close()


def image_chat_tokens(server: Server, seed: int) -> list[int]:
    """The token ids of a chat with one image (``seed``) answered by ``server``."""
    body = {"model": str(PEER_MODEL), "max_tokens": 3, "return_token_ids": True, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(
            make_image(40, 32, seed=seed))}}, {"type": "text", "text": "What?"}]}]}
    answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    token_ids: list[int] = answer["choices"][0]["token_ids"]
    return token_ids


def engine_group(server: Server) -> list[str]:
    """The process ids of the process group of ``server``'s one ``vllm serve --headless``."""
    [engine] = headless_children(server.process.pid)
    return [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == os.getpgid(engine)]


def stop_idle(server: Server, members: list[str]) -> None:
    """SIGTERM the idle ``server``: it exits 0 within :data:`IDLE_STOP_S`, and none of ``members``
    (process ids: its engines' groups, its API servers) is left running."""
    stop = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0, server.tail()
    stopped_s = time.monotonic() - stop
    print(f"SIGTERM to exit, idle: {stopped_s:.2f} s")
    assert not [p for p in members if _alive(int(p))], "a process of the server outlived it"
    assert stopped_s < IDLE_STOP_S, server.tail()


def headless_children(pid: int) -> list[int]:
    """The ``vllm serve --headless`` processes ``pid`` started."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == pid and _alive(int(p))
            and b"--headless" in _cmdline(int(p))]


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat``'s fields after the name: state, parent, process group, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def _pgid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields else None
