"""``mmfront serve`` starts and stops as ``vllm serve`` does: a port in use fails before any
engine starts, ``--max-model-len`` above the model's limit is refused with vLLM's message, the
banner names the model, the engines and the addresses, the wait for headless engines is logged
every interval, an engine's death is logged with its rank and exit status and stops the server
with status 1 unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` is set (tests/serve/test_cli_serve_http.py
runs the kept-alive server), and the command ends its process at once after its atexit handlers."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mmfront import MultiModalConfig
from mmfront.config import DataParallelConfig
from mmfront.errors import AddressInUseError, ConfigError, HandshakeError
from mmfront.network import get_open_port
from mmfront.serve import launcher
from mmfront.serve.banner import engines_banner
from mmfront.serve.launcher import (
    ENGINE_KIND,
    bind_handshake,
    bind_link,
    keep_alive_on_engine_death,
    listening_socket,
    log_engine_exit,
    meet_engines,
)
from mmfront.serve.model_limits import check_max_model_len
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()

TOO_LONG = ("User-specified max_model_len (131073) is greater than the derived max_model_len "
            "(max_position_embeddings=131072.0 or model_max_length=None in model's config.json).")
REFUSAL = f"{TOO_LONG} To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
CAUTION = "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution."


def serve_command(model: Path, port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "mmfront.cli", "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--mm-processor-cache-gb", "0.02", "--processing-lanes", "0", *flags]


def test_a_port_in_use_fails_before_any_engine_starts(gemma3_dir: Path) -> None:
    """The folder has no weights: an engine started would fail the start with its own message."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(serve_command(gemma3_dir, port), check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert (f"mmfront serve: Cannot listen on 127.0.0.1:{port}: Address already in use. Another process holds the "
            "port: stop it or choose another --port.") in done.stderr
    assert "engines:" not in done.stderr and "Engine rank" not in done.stderr  # no banner, no engine


def test_listening_socket_names_the_address_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AddressInUseError, match=rf"^Cannot listen on 127\.0\.0\.1:{port}: Address already in use"):
            listening_socket("127.0.0.1", port)
    listening_socket("127.0.0.1", port).close()  # free again


def test_max_model_len_above_the_models_limit_is_refused_with_vllms_message(gemma3_dir: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    check_max_model_len(131072, gemma3_dir, env={})  # Gemma 3's text config: max_position_embeddings 131072
    check_max_model_len(None, gemma3_dir, env={})
    with pytest.raises(ConfigError) as refused:
        check_max_model_len(131073, gemma3_dir, env={})
    assert str(refused.value).startswith(f"{REFUSAL} {CAUTION}")
    with caplog.at_level(logging.WARNING, logger="mmfront.serve.model_limits"):
        check_max_model_len(131073, gemma3_dir, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    [warning] = caplog.records
    assert warning.getMessage().startswith(f"{TOO_LONG} {CAUTION}")


_VLLM_REFUSAL = textwrap.dedent("""
    import sys
    from vllm.config import ModelConfig
    try:
        ModelConfig(model=sys.argv[1], max_model_len=int(sys.argv[2]))
    except Exception as e:
        print(str(e).split("Value error, ", 1)[1].splitlines()[0].split(" [type=value_error")[0])  # pydantic's frame
""")


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(PEER is None, reason=SKIP_REASON)
def test_the_refusal_is_vllms_own(gemma3_dir: Path) -> None:
    assert PEER is not None
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ALLOW_LONG_MAX_MODEL_LEN"}
    done = subprocess.run([str(PEER), "-c", _VLLM_REFUSAL, str(gemma3_dir), "131073"], check=True,
                          capture_output=True, text=True, timeout=300, env={**env, "VLLM_TARGET_DEVICE": "cpu"})
    with pytest.raises(ConfigError) as refused:
        check_max_model_len(131073, gemma3_dir, env={})
    assert done.stdout.strip() == str(refused.value)


def test_the_command_refuses_max_model_len_before_any_engine_starts(gemma3_dir: Path) -> None:
    done = subprocess.run(serve_command(gemma3_dir, get_open_port(), "--max-model-len", "131073"), check=False,
                          capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                       if k != "VLLM_ALLOW_LONG_MAX_MODEL_LEN"})
    assert done.returncode == 2, done.stderr
    assert f"mmfront serve: {REFUSAL}" in done.stderr
    assert "Engine rank" not in done.stderr


def test_the_banner_names_the_model_the_engines_and_the_addresses(tmp_path: Path) -> None:
    local = ServePlan(ServeSettings(tmp_path, served_model_name=("tiny",), host="127.0.0.1", port=8123),
                      MultiModalConfig(), DataParallelConfig(2))
    assert engines_banner(local, ENGINE_KIND) == (f"mmfront serve: model {tmp_path} (served as tiny); engines: 2 local mmfront worker "
                             "(mmfront's reference engine on HF transformers); API on http://127.0.0.1:8123")
    mixed = ServePlan(ServeSettings(tmp_path, uds="/tmp/s.sock"), MultiModalConfig(),
                      DataParallelConfig(3, 1, "10.0.0.2", 29555))
    assert engines_banner(mixed, ENGINE_KIND) == (f"mmfront serve: model {tmp_path} (served as {tmp_path}); engines: 1 local mmfront "
                             "worker (mmfront's reference engine on HF transformers) + 2 headless at "
                             "tcp://10.0.0.2:29555; API on unix:/tmp/s.sock")


def test_the_wait_for_headless_engines_is_logged_every_interval(
        gemma3_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(launcher, "WAIT_LOG_INTERVAL_S", 0.5)
    port = get_open_port()
    plan = ServePlan(ServeSettings(gemma3_dir), MultiModalConfig(mm_processor_cache_gb=0.02, mm_processing_lanes=0),
                     DataParallelConfig(1, 0, "127.0.0.1", port), engine_ready_timeout_s=1.8)
    link = bind_link(plan)
    handshake = bind_handshake(link, plan)
    with caplog.at_level(logging.INFO, logger="mmfront.serve.launcher"), pytest.raises(HandshakeError):
        meet_engines(link, handshake, plan, None)
    link.transport.close()
    waiting = f"Waiting for 1 engine(s) at tcp://127.0.0.1:{port}"
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (f"{waiting}: start them with 'vllm serve MODEL --headless' or 'mmfront worker MODEL "
                        f"--data-parallel-address 127.0.0.1 --data-parallel-rpc-port {port}'")
    assert 2 <= len(lines) - 1 <= 4 and all(line.startswith(f"{waiting} (") and line.endswith(" s so far)")
                                            for line in lines[1:]), lines


def test_an_engines_death_is_logged_with_its_rank_and_status(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="mmfront.serve.launcher"):
        log_engine_exit(1, 3)
        log_engine_exit(0, -signal.SIGKILL)
    assert [r.getMessage() for r in caplog.records] == [
        "Engine rank 1 (mmfront worker) died: exit status 3. The requests it had fail.",
        "Engine rank 0 (mmfront worker) died: killed by signal 9. The requests it had fail."]


@pytest.mark.parametrize(("value", "kept"), [(None, False), ("0", False), ("1", True), ("2", True)])
def test_keep_alive_is_read_as_vllm_reads_it(value: str | None, kept: bool) -> None:
    assert keep_alive_on_engine_death({} if value is None else {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": value}) is kept


def test_a_keep_alive_that_is_not_an_integer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH='yes': give 1"):
        keep_alive_on_engine_death({"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "yes"})


_ENDS = textwrap.dedent("""
    import atexit, logging, sys
    from mmfront.process_end import run_and_end_the_process
    how = sys.argv[1]
    def command():
        logging.getLogger("probe").addHandler(logging.FileHandler(sys.argv[2]))
        logging.getLogger("probe").warning("logged")
        atexit.register(print, "handler ran", flush=True)
        if how == "message":
            raise SystemExit("refused")
        return 0 if how == "zero" else 3
    run_and_end_the_process(command)
""")


@pytest.mark.parametrize(("how", "status"), [("zero", 0), ("three", 3), ("message", 1)])
def test_the_command_ends_its_process_with_its_status_after_the_atexit_handlers(how: str, status: int,
                                                                                tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    done = subprocess.run([sys.executable, "-c", _ENDS, how, str(log)], check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == status and done.stdout == "handler ran\n", done.stderr
    assert done.stderr == ("refused\n" if how == "message" else "")
    assert log.read_text() == "logged\n"  # logging shut down (its files flushed and closed)


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_an_engines_death_stops_the_server_with_status_1(gemma3_weights_dir: Path, tmp_path: Path) -> None:
    port = get_open_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(serve_command(gemma3_weights_dir, port), stdout=out, stderr=subprocess.STDOUT,
                                  env={**env, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while _health(port) != 200:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        [engine] = [pid for pid in _children(server.pid) if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(engine, signal.SIGKILL)
        assert server.wait(60) == 1, log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    text = log.read_text()
    assert "Engine rank 0 (mmfront worker) died: killed by signal 9." in text
    assert ("Stopping the server (exit status 1) as vllm serve does; set VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 to keep "
            "it up.") in text
