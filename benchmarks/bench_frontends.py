"""``mmfront serve`` against both of vLLM 0.33's frontends, ``vllm serve`` (Python) and
``VLLM_USE_RUST_FRONTEND=1 vllm serve`` (``vllm-rs``), each API server in front of its own fresh
STOCK vLLM engine core, per model (issue 34).

Each side is started as tests/serve/test_vllm_serve_parity.py starts it: the engine is
``../shared/peer/stock_engine.py`` (``vllm serve --headless`` with the stub executor: no model,
generated token k = 1000 + 10 * images + k), the API server gets ``--data-parallel-size-local 0``
and the engine connects to it. The Rust side sets ``VLLM_USE_RUST_FRONTEND=1`` for the engine
too (it turns device normalisation off there, as the Rust frontend sends normalised pixels).

The client is vLLM's own, ``vllm bench serve --backend openai-chat`` from the peer venv: the
``random-mm`` dataset, one JPEG of the model's image size per request, ``INPUT_TOKENS`` random
text tokens, ``OUTPUT_TOKENS`` output tokens (``--ignore-eos``), ``IN_FLIGHT`` in flight. After
a warm-up request (a small image of its own) a server gets two passes with the same seed: all-new
images, then the same images again (a frontend with a processor cache hits it).

Per pass: requests/s and the median time to first token from the client's saved result, and the
API server's CPU per request: user + system CPU time of the server's whole process tree (its
process group: ``vllm serve``'s supervisor and ``vllm-rs``, ``mmfront serve``'s processing
lanes), read from ``/proc`` before and after the pass, over the pass's requests. The engine runs
in another process group and is not counted. Also the server's peak resident set while it starts
(sampled every ``SAMPLE_S``), and its peak proportional set (shared pages counted once: ``mmfront
serve``'s lane is forked from a lane parent and shares its pages, which the resident sets of the
two count twice); a server above ``RSS_CAP`` is stopped and reported as not started,
so one side's start-up bug cannot take the shared machine down.

Configurations (``CONFIGS``): Qwen2.5-VL on an offline folder built by
:func:`mmfront.testing.peer.qwen2_5_vl_peer_folder` (real patch and merge sizes, ``min_pixels``
3136) with a small pixel limit (at most 16 tokens an image) and with the standard one (12845056 pixels),
1024x768 images; Gemma 3 on the peer venv's ``tiny-gemma3-896`` folder (real sizes, 256 tokens
an image), 896x896 images, where the Rust frontend is not measured (``vllm-rs`` has no Gemma 3
image processor). ``MMFRONT_BENCH_FRONTENDS`` (comma-separated keys) runs only some of them.

The order of the sides alternates from round to round; figures are medians over rounds, and each
ratio is mmfront's against the faster vLLM frontend of the same round (the one with more
requests/s in that pass), its median over rounds. Targets (issue 34): new images, requests/s
>= 1.3x, median TTFT <= 0.8x, CPU per request <= 0.6x; the same images again, requests/s >= 2x,
CPU per request <= 0.3x.

Needs the vLLM peer venv (:func:`mmfront.testing.peer.vllm_peer_python`) and ``../shared/peer``;
without them the benchmark is skipped and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, NamedTuple

from _harness import Report, log_tail, stop_process
from mmfront.network import get_open_ports_list
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, qwen2_5_vl_peer_folder, vllm_peer_model_dir, vllm_peer_python

GROUP = "frontends"
REPO = Path(__file__).resolve().parents[1]
PEER_DIR = REPO.parent / "shared" / "peer"
SERVED_NAME = "bench-model"
SIDES = ("mmfront", "vLLM", "vLLM Rust")
VLLM_SIDES = SIDES[1:]
IN_FLIGHT = 8
OUTPUT_TOKENS = 8
INPUT_TOKENS = 32
ROUNDS = 3
PROMPTS = 128
"""Requests a pass. Each pass's client (``vllm bench serve``) spends ~16 s of CPU starting (it imports
vLLM) before its requests take 0.3-2 s, and the server's CPU is read around the whole run; the
same tree's hit pass read 2.8-4.8 ms of CPU a request over 64 requests from run to run (2026-12-07),
so a pass sends twice that and three rounds give a median that is one round's figure."""
STARTUP_S = 300.0
"""How long an engine and its server may take to start."""
PASS_S = 400.0
"""How long one ``vllm bench serve`` run may take, its own start-up included."""
SAMPLE_S = 0.2
RSS_CAP = 6 << 30
"""A server whose process tree holds more than this while it starts is stopped (``vllm serve``
peaks below 1 GiB on these folders; issue 34 saw ``mmfront serve`` reach 13 GB on Qwen2.5-VL's
standard limits)."""
SELECT_ENV = "MMFRONT_BENCH_FRONTENDS"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
QWEN_STANDARD_MAX_PIXELS = 12845056
QWEN_SMALL_MAX_PIXELS = 12544
"""At most 16 tokens an image (112x112 px: 8x8 patches of 14 px, merged 2x2); a 1024x768 image
becomes 112x84 px, 12 tokens."""


class Config(NamedTuple):
    """One model and its limits, served by every side that can serve it."""

    key: str
    name: str
    image: tuple[int, int]
    """Width and height of the client's random images."""
    max_model_len: int
    folder: Callable[[Path, Path], Path]
    """The model folder, from the peer's python and a work folder."""
    rust: str | None = None
    """Why the Rust frontend is not measured, or ``None``."""


def _gemma3_folder(python: Path, work: Path) -> Path:
    folder = vllm_peer_model_dir(python)
    if folder is None:
        raise RuntimeError("the peer venv has no tiny-gemma3-896 folder (../shared/peer/vllm_peer_setup.sh writes it)")
    return folder


CONFIGS = (
    Config("qwen2.5-vl-small", "Qwen2.5-VL, small limit", (1024, 768), 4096,
           lambda python, work: qwen2_5_vl_peer_folder(work, QWEN_SMALL_MAX_PIXELS)),
    Config("qwen2.5-vl", "Qwen2.5-VL, standard limits", (1024, 768), 20480,
           lambda python, work: qwen2_5_vl_peer_folder(work, QWEN_STANDARD_MAX_PIXELS)),
    Config("gemma3", "Gemma 3", (896, 896), 4096, _gemma3_folder,
           rust="vllm-rs has no Gemma 3 image processor"),
)



class Pass(NamedTuple):
    requests_per_s: float
    median_ttft_ms: float
    cpu_ms_per_request: float


class Served(NamedTuple):
    """One side in one round: its passes (new images, then the same again), or why it has none."""

    side: str
    startup_rss_mib: float
    startup_pss_mib: float
    passes: list[Pass]
    failed: str


def _group_members(pgid: int) -> list[list[str]]:
    """The ``/proc/PID/stat`` fields after the command name, for every process of the group."""
    return list(_group_stats(pgid).values())


def _group_stats(pgid: int) -> dict[str, list[str]]:
    """Every process of the group: its ``/proc`` folder and its stat fields after the command name."""
    members = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            text = Path(entry.path, "stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
            if int(fields[2]) == pgid:  # field 5, pgrp
                members[entry.path] = fields
    return members


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the process group's live processes and of the children they
    reaped (fields 14-17: utime, stime, cutime, cstime)."""
    return sum(sum(int(f) for f in fields[11:15]) for fields in _group_members(pgid)) / TICKS_PER_S


def group_rss_bytes(pgid: int) -> int:
    """Resident set of the process group (field 24, in pages): a page two of its processes share
    (a forked lane and the lane parent it was forked from) counts twice."""
    return sum(int(fields[21]) for fields in _group_members(pgid)) * os.sysconf("SC_PAGE_SIZE")


def group_pss_bytes(pgid: int) -> int:
    """Proportional set of the process group (``Pss`` of ``/proc/PID/smaps_rollup``): each resident
    page divided among the processes that map it, so the group's shared pages count once and its
    share of pages mapped outside it (libraries the engine maps too) in part."""
    total = 0
    for folder in _group_stats(pgid):
        with contextlib.suppress(OSError):
            rollup = Path(folder, "smaps_rollup").read_text()
            total += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return total * 1024


def _peer_env(rust: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS="1")
    if rust:
        env["VLLM_USE_RUST_FRONTEND"] = "1"
    return env


def _server_flags(config: Config) -> list[str]:
    return ["--max-model-len", str(config.max_model_len), "--limit-mm-per-prompt", '{"image": 4}']


def launch_side(side: str, python: Path, model: Path, config: Config, logs: tuple[IO[bytes], IO[bytes]], *,
                pythonpath: str | None = None) -> tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The stock engine and ``side``'s API server pointed at each other; the server's base URL.
    ``pythonpath``: where ``mmfront serve`` imports from (this process's ``PYTHONPATH`` by default)."""
    rpc, port = get_open_ports_list(2)
    rust = side == "vLLM Rust"
    engine = subprocess.Popen(
        [str(python), str(PEER_DIR / "stock_engine.py"), str(model), f"tcp://127.0.0.1:{rpc}", "--",
         *_server_flags(config)],
        cwd=PEER_DIR, stdout=logs[0], stderr=subprocess.STDOUT, env=_peer_env(rust), start_new_session=True)
    if side == "mmfront":
        program = [sys.executable, "-m", "mmfront.cli"]
        env = {**_peer_env(False), "PYTHONPATH": os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath}
    else:
        program = [str(python.parent / "vllm")]
        env = _peer_env(rust)
    argv = [*program, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", SERVED_NAME, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc), *_server_flags(config)]
    try:
        server = subprocess.Popen(argv, stdout=logs[1], stderr=subprocess.STDOUT, env=env, start_new_session=True)
    except BaseException:
        stop_process(engine)
        raise
    return f"http://127.0.0.1:{port}", server, engine


def wait_healthy(base: str, server: subprocess.Popen[bytes], engine: subprocess.Popen[bytes],
                  logs: tuple[Path, Path]) -> tuple[int, int]:
    """Waits until ``/health`` answers 200; the server's peak resident and proportional sets
    meanwhile (:func:`group_rss_bytes`, :func:`group_pss_bytes`), in bytes."""
    deadline = time.monotonic() + STARTUP_S
    peak = peak_pss = 0
    while time.monotonic() < deadline:
        if server.poll() is not None or engine.poll() is not None:
            raise RuntimeError(f"a process exited before the server was ready: {[log_tail(log) for log in logs]}")
        peak = max(peak, group_rss_bytes(server.pid))
        peak_pss = max(peak_pss, group_pss_bytes(server.pid))
        if peak > RSS_CAP:
            raise RuntimeError(f"the server's processes held {peak / 2**30:.1f} GiB while starting "
                               f"(over the bench's cap of {RSS_CAP / 2**30:.0f} GiB)")
        with contextlib.suppress(OSError, urllib.error.URLError), \
                urllib.request.urlopen(base + "/health", timeout=2) as reply:
            if reply.status == 200:
                return peak, peak_pss
        time.sleep(SAMPLE_S)
    raise RuntimeError(f"the server was not healthy after {STARTUP_S:.0f} s: {[log_tail(log) for log in logs]}")


def warm_up(base: str) -> None:
    image = image_data_url(make_image(64, 48, seed=7), "JPEG")
    body = {"model": SERVED_NAME, "max_tokens": OUTPUT_TOKENS, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is in this picture?"}]}]}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        json.load(reply)


def _client_pass(python: Path, model: Path, config: Config, base: str, seed: int, prompts: int,
                 result: Path, log: IO[bytes], server_pid: int) -> Pass:
    """One pass of vLLM's own client; the API server's CPU time is read around it."""
    width, height = config.image
    command = [str(python.parent / "vllm"), "bench", "serve", "--backend", "openai-chat", "--base-url", base,
               "--endpoint", "/v1/chat/completions", "--model", str(model), "--served-model-name", SERVED_NAME,
               "--dataset-name", "random-mm", "--num-prompts", str(prompts), "--seed", str(seed),
               "--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS),
               "--random-range-ratio", "0", "--random-mm-base-items-per-request", "1",
               "--random-mm-num-mm-items-range-ratio", "0",
               "--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}',
               "--random-mm-bucket-config", f"{{({height}, {width}, 1): 1.0}}",
               "--max-concurrency", str(IN_FLIGHT), "--request-rate", "inf", "--ignore-eos", "--disable-tqdm",
               "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    log.write(f"$ {' '.join(command)}\n".encode())
    log.flush()
    before = group_cpu_s(server_pid)
    code = subprocess.run(command, check=False, stdout=log, stderr=subprocess.STDOUT, env=_peer_env(False),
                          timeout=PASS_S, start_new_session=True).returncode
    cpu_s = group_cpu_s(server_pid) - before
    if code != 0 or not result.is_file():
        raise RuntimeError(f"vllm bench serve exited with code {code}: {log_tail(Path(log.name))}")
    saved = json.loads(result.read_text())
    if saved["completed"] != prompts or saved.get("failed", 0):
        raise RuntimeError(f"vllm bench serve: {saved['completed']} of {prompts} requests completed, "
                           f"{saved.get('failed')} failed: {log_tail(Path(log.name))}")
    return Pass(float(saved["request_throughput"]), float(saved["median_ttft_ms"]), cpu_s * 1e3 / prompts)


def serve_side(side: str, python: Path, model: Path, config: Config, seed: int, prompts: int,
               folder: Path) -> Served:
    """``side`` on a fresh engine: started, warmed up, then its two passes; a side that does not
    start or fails a pass is returned with the reason (the other sides still run)."""
    tag = f"{config.key}-{side.replace(' ', '-')}-{seed}"
    logs = tuple(folder / f"{tag}-{name}.log" for name in ("engine", "server", "bench"))
    rss = pss = 0.0
    passes, failed = [], ""
    with logs[0].open("wb") as elog, logs[1].open("wb") as slog, logs[2].open("wb") as blog:
        base, server, engine = launch_side(side, python, model, config, (elog, slog))
        try:
            rss, pss = (peak / 2**20 for peak in wait_healthy(base, server, engine, (logs[1], logs[0])))
            warm_up(base)
            passes = [_client_pass(python, model, config, base, seed, prompts, folder / f"{tag}-{n}.json", blog,
                                   server.pid) for n in range(2)]
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            failed = f"{type(e).__name__}: {e}"[:600]
        finally:
            stop_process(server, grace_s=10)
            stop_process(engine)
    said = failed or "; ".join(f"{p.requests_per_s:.1f}/s, TTFT {p.median_ttft_ms:.0f} ms, CPU {p.cpu_ms_per_request:.1f} ms"
                               for p in passes)
    print(f"  {GROUP}: {config.name}, {side}, seed {seed}: {said}", file=sys.stderr, flush=True)
    return Served(side, rss, pss, passes, failed)


def measure(python: Path, config: Config, sides: Sequence[str], *, rounds: int, prompts: int,
            folder: Path) -> list[dict[str, Served]]:
    """Every side of ``config`` per round, the order of the sides reversed every other round."""
    model = config.folder(python, folder)
    results: list[dict[str, Served]] = []
    for round_ in range(rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        results.append({side: serve_side(side, python, model, config, 1000 + round_, prompts, folder)
                        for side in order})
    return results


def rust_frontend(python: Path) -> Path | None:
    """The ``vllm-rs`` binary the peer's vLLM wheel ships, or ``None``."""
    found = sorted(python.parents[1].glob("lib/python3*/site-packages/vllm/vllm-rs"))
    return found[0] if found else None


def sides_of(config: Config, python: Path) -> tuple[list[str], str | None]:
    """The sides that serve ``config`` here, and why the Rust frontend is left out (or ``None``)."""
    if config.rust is not None:
        return list(SIDES[:2]), config.rust
    if rust_frontend(python) is None:
        return list(SIDES[:2]), "the peer's vLLM wheel has no vllm-rs binary"
    return list(SIDES), None


PASSES = ("new images", "same images again")
TARGETS: dict[tuple[int, str], dict[str, float]] = {
    (0, "requests/s"): {"at_least": 1.3}, (0, "median TTFT"): {"at_most": 0.8}, (0, "CPU per request"): {"at_most": 0.6},
    (1, "requests/s"): {"at_least": 2.0}, (1, "median TTFT"): {}, (1, "CPU per request"): {"at_most": 0.3},
}
"""Issue 34's targets, against the faster vLLM frontend: (pass, measure) -> ``Report.ratio`` bound."""
MEASURES = (("requests/s", "requests_per_s", "/s"), ("median TTFT", "median_ttft_ms", "ms"),
            ("CPU per request", "cpu_ms_per_request", "ms"))


def report_config(report: Report, config: Config, results: list[dict[str, Served]], skipped_rust: str | None) -> None:
    """Medians per side and the ratios against the faster vLLM frontend of each round."""
    name = config.name
    if skipped_rust is not None:
        report.add(GROUP, f"{name}: vLLM Rust not measured ({skipped_rust})", 0.0, "")
    sides = list(results[0]) if results else []
    for side in sorted(sides, key=SIDES.index):
        failures = [r[side].failed for r in results if r[side].failed]
        if failures:
            report.add(GROUP, f"{name}: {side} failed in {len(failures)} of {len(results)} rounds: {failures[0]}",
                       0.0, "")
        good = [r[side] for r in results if not r[side].failed]
        if not good:
            continue
        report.add(GROUP, f"{name}: {side}: start-up peak RSS", statistics.median(s.startup_rss_mib for s in good),
                   "MiB")
        report.add(GROUP, f"{name}: {side}: start-up peak PSS", statistics.median(s.startup_pss_mib for s in good),
                   "MiB")
        for n, what in enumerate(PASSES):
            for label, attribute, unit in MEASURES:
                report.add(GROUP, f"{name}: {side}: {what}, {label}",
                           statistics.median(getattr(s.passes[n], attribute) for s in good), unit)
    for n, what in enumerate(PASSES):
        pairs = []
        for r in results:
            vllm = [r[s] for s in VLLM_SIDES if s in r and not r[s].failed]
            if r["mmfront"].failed or not vllm:
                continue
            faster = max(vllm, key=lambda s: s.passes[n].requests_per_s)
            pairs.append((r["mmfront"].passes[n], faster))
        if not pairs:
            report.add(GROUP, f"{name}: {what}: no round where mmfront and a vLLM frontend both ran", 0.0, "")
            continue
        faster_sides = sorted({s.side for _, s in pairs})
        report.add(GROUP, f"{name}: {what}: faster vLLM frontend: {' / '.join(faster_sides)}", 0.0, "")
        for label, attribute, _ in MEASURES:
            value = statistics.median(getattr(m, attribute) / getattr(s.passes[n], attribute) for m, s in pairs)
            report.ratio(GROUP, f"{name}: {what}: mmfront / faster vLLM, {label}", value,
                         **TARGETS[(n, label)])


def selected_configs() -> list[Config]:
    keys = [k.strip() for k in os.environ.get(SELECT_ENV, "").split(",") if k.strip()]
    unknown = sorted(set(keys) - {c.key for c in CONFIGS})
    if unknown:
        raise SystemExit(f"{SELECT_ENV}: unknown configuration {unknown}; known: {[c.key for c in CONFIGS]}")
    return [c for c in CONFIGS if not keys or c.key in keys]


def stock_engine_python(report: Report, group: str) -> Path | None:
    """The peer venv's python, where it and ``../shared/peer`` can start a stock engine; else
    ``None``, the skip reported under ``group``."""
    python = vllm_peer_python()
    if python is None or not (PEER_DIR / "stock_engine.py").is_file():
        print(f"  {group}: {SKIP_REASON} (and ../shared/peer/stock_engine.py)", file=sys.stderr)
        report.add(group, "vLLM peer not found: skipped (no stock engine)", 0.0, "")
        return None
    return python


def run(report: Report, quick: bool) -> None:
    python = stock_engine_python(report, GROUP)
    if python is None:
        return
    rounds, prompts = (1, 32) if quick else (ROUNDS, PROMPTS)
    with tempfile.TemporaryDirectory(prefix="mmfront-frontends-bench-") as name:
        for config in selected_configs():
            sides, skipped_rust = sides_of(config, python)
            try:
                results = measure(python, config, sides, rounds=rounds, prompts=prompts, folder=Path(name))
            except RuntimeError as e:
                report.add(GROUP, f"{config.name}: not measured ({e})", 0.0, "")
                continue
            report_config(report, config, results, skipped_rust)
    report.add(GROUP, f"({prompts} requests a pass, {IN_FLIGHT} in flight, {rounds} rounds)", 0.0, "")
