"""``mmfront serve MODEL`` takes a hub id as ``vllm serve`` does: downloaded by ``huggingface_hub``
into its cache where the network allows it (the weights left to vLLM's engines, fetched for the
reference workers), then read from that cache (``--revision`` a branch or a commit,
``--download-dir`` the cache, ``HF_HUB_CACHE``/``HF_HUB_OFFLINE`` from the environment),
``--tokenizer`` a hub id of its own at ``--tokenizer-revision``, served and reported under the id;
an id missing offline, unknown, gated or without the revision ends the command with exit 2 and a
message saying what to do. The hub is a loopback one (tests/local_hub.py), so huggingface_hub
writes the cache itself and nothing leaves the machine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_hub import HubRepo, serve_hub
from mmfront.cli import build_parser
from mmfront.errors import ModelFilesNotFoundError
from mmfront.hub import resolve_model_folder
from mmfront.network import get_open_port
from mmfront.serve.args import plan_from_args
from mmfront.serve.banner import non_default_args
from mmfront.serve.settings import ServePlan
from mmfront.testing.media import image_data_url, make_image

MAIN = "a" * 40
V1 = "b" * 40
TOKENIZER_COMMIT = "c" * 40
WEIGHTS_COMMIT = "d" * 40
REPO = "tiny-org/tiny-vl"
TOKENIZER_REPO = "tiny-org/tiny-tokenizer"
WEIGHTS_REPO = "tiny-org/tiny-weights"
WEIGHTS = {"model.safetensors": b"W" * 64, "model.safetensors.index.json": b"{}"}

RESOLVE_SCRIPT = """
import json, sys
from mmfront.cli import build_parser
from mmfront.errors import ModelFilesNotFoundError
from mmfront.serve.args import plan_from_args
out = []
for argv in json.loads(sys.argv[1]):
    try:
        plan = plan_from_args(build_parser().parse_args(["serve", *argv]))
        out.append([str(plan.model_folder), plan.config.tokenizer])
    except ModelFilesNotFoundError as e:
        out.append(str(e))
print(json.dumps(out))
"""


def resolve_in_fresh_interpreter(env: dict[str, str], *argvs: list[str]) -> list[object]:
    """Each ``mmfront serve`` command line's model folder and tokenizer (or its error's message),
    in one fresh interpreter with ``env`` (huggingface_hub reads its environment when imported)."""
    done = subprocess.run([sys.executable, "-c", RESOLVE_SCRIPT, json.dumps(argvs)], check=False, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", **env})
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def online(hub: str) -> dict[str, str]:
    """The environment of a process that downloads from ``hub`` (the suite runs with ``HF_HUB_OFFLINE=1``)."""
    return {"HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "0"}


@pytest.fixture(scope="module")
def hub(gemma3_dir: Path, idefics3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A loopback hub: ``REPO`` at two commits (``main``: Gemma 3's folder; ``v1``: Idefics3's),
    ``TOKENIZER_REPO`` (Idefics3's tokenizer files alone), ``WEIGHTS_REPO`` (Gemma 3's folder with
    weight files) and a gated repository."""
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tokenizer / name).write_bytes((idefics3_dir / name).read_bytes())
    repos = {REPO: HubRepo(), TOKENIZER_REPO: HubRepo(), WEIGHTS_REPO: HubRepo(), "tiny-org/gated": HubRepo(gated=True)}
    repos[REPO].add(MAIN, gemma3_dir, "main")
    repos[REPO].add(V1, idefics3_dir, "v1")
    repos[TOKENIZER_REPO].add(TOKENIZER_COMMIT, tokenizer, "main")
    repos[WEIGHTS_REPO].add(WEIGHTS_COMMIT, gemma3_dir, "main", extra=WEIGHTS)
    with serve_hub(repos) as url:
        yield url


@pytest.fixture(scope="module")
def cache(hub: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache huggingface_hub wrote downloading ``REPO`` at ``main`` and ``v1`` and
    ``TOKENIZER_REPO`` through ``mmfront serve``'s resolution."""
    root = tmp_path_factory.mktemp("hub") / "cache"
    got = resolve_in_fresh_interpreter(
        online(hub), [REPO, "--download-dir", str(root), "-dpl", "0"],
        [REPO, "--download-dir", str(root), "--revision", "v1", "--tokenizer", TOKENIZER_REPO, "-dpl", "0"])
    assert got == [[str(snapshot(root, REPO, MAIN)), None],
                   [str(snapshot(root, REPO, V1)), str(snapshot(root, TOKENIZER_REPO, TOKENIZER_COMMIT))]]
    return root


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HF_HUB_OFFLINE=1`` for this process's huggingface_hub, imported already."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def snapshot(cache: Path, repo: str, commit: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit


def plan(*argv: str) -> ServePlan:
    return plan_from_args(build_parser().parse_args(["serve", *argv]))


def test_the_cache_is_huggingface_hubs_own(cache: Path, offline: None) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

    info = scan_cache_dir(cache)
    assert info.warnings == []
    repos = {r.repo_id: r for r in info.repos}
    assert sorted(repos) == [TOKENIZER_REPO, REPO]
    assert {r.commit_hash: set(r.refs) for r in repos[REPO].revisions} == {MAIN: {"main"}, V1: {"v1"}}
    assert {f.file_name for f in next(iter(repos[TOKENIZER_REPO].revisions)).files} == {
        "tokenizer.json", "tokenizer_config.json"}
    assert snapshot_download(REPO, cache_dir=cache, revision="v1") == str(snapshot(cache, REPO, V1))
    assert try_to_load_from_cache(REPO, "config.json", cache_dir=cache) == str(
        snapshot(cache, REPO, MAIN) / "config.json")


def test_a_cached_hub_id_is_served_from_its_snapshot_under_its_id(cache: Path, offline: None) -> None:
    p = plan(REPO, "--download-dir", str(cache), "--data-parallel-size-local", "0")
    assert p.settings.model == REPO and p.settings.model_names == (REPO,)
    assert p.model_folder == snapshot(cache, REPO, MAIN)
    assert json.loads((p.model_folder / "config.json").read_text())["model_type"] == "gemma3"
    assert (p.source.download_dir, p.source.revision) == (str(cache), None)


def test_revision_picks_a_branch_or_a_commit(cache: Path, offline: None) -> None:
    for revision in ("v1", V1):
        p = plan(REPO, "--download-dir", str(cache), "--revision", revision, "-dpl", "0")
        assert p.model_folder == snapshot(cache, REPO, V1)
        assert json.loads((p.model_folder / "config.json").read_text())["model_type"] == "idefics3"
    assert plan(REPO, "--download-dir", str(cache), "--revision", MAIN, "-dpl", "0").model_folder == snapshot(
        cache, REPO, MAIN)


def test_tokenizer_is_a_hub_id_of_its_own_at_its_own_revision(cache: Path, gemma3_dir: Path, offline: None) -> None:
    p = plan(str(gemma3_dir), "--download-dir", str(cache), "--tokenizer", TOKENIZER_REPO,
             "--tokenizer-revision", TOKENIZER_COMMIT, "-dpl", "0")
    assert p.model_folder == gemma3_dir and p.config.tokenizer == str(snapshot(cache, TOKENIZER_REPO,
                                                                                TOKENIZER_COMMIT))
    assert plan(REPO, "--download-dir", str(cache), "--tokenizer", str(gemma3_dir), "-dpl", "0").config.tokenizer == (
        str(gemma3_dir))
    with pytest.raises(ModelFilesNotFoundError, match=r"^--tokenizer 'tiny-org/tiny-tokenizer' is not a folder.* "
                                                      r"at revision 'v9'"):
        plan(str(gemma3_dir), "--download-dir", str(cache), "--tokenizer", TOKENIZER_REPO,
             "--tokenizer-revision", "v9", "-dpl", "0")


def test_the_token_is_kept_out_of_the_logged_arguments(cache: Path, offline: None) -> None:
    p = plan(REPO, "--download-dir", str(cache), "--hf-token", "hf_secret", "-dpl", "0")
    assert p.source.hf_token == "hf_secret" and "hf_secret" not in repr(p.source)
    logged = non_default_args(p)
    assert (logged["hf_token"], logged["download_dir"], logged["resolved_model"]) == (
        "***", str(cache), snapshot(cache, REPO, MAIN))


def test_a_file_or_a_malformed_id_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelFilesNotFoundError, match=r"^MODEL '.*model.safetensors' is a file; pass the model's"):
        resolve_model_folder(tmp_path / "model.safetensors")
    with pytest.raises(ModelFilesNotFoundError, match=r"^MODEL 'a/b/c' is neither a folder nor a hub id"):
        resolve_model_folder("a/b/c", download_dir=tmp_path)


def test_the_weights_are_downloaded_only_for_the_reference_workers(hub: str, tmp_path: Path) -> None:
    """vLLM's engines download their own; ``mmfront worker`` loads them from the server's snapshot."""
    api_only, with_workers = resolve_in_fresh_interpreter(
        online(hub), [WEIGHTS_REPO, "--download-dir", str(tmp_path / "a"), "-dpl", "0"],
        [WEIGHTS_REPO, "--download-dir", str(tmp_path / "b")])
    folder = snapshot(tmp_path / "a", WEIGHTS_REPO, WEIGHTS_COMMIT)
    assert api_only == [str(folder), None] and with_workers == [str(snapshot(tmp_path / "b", WEIGHTS_REPO,
                                                                                   WEIGHTS_COMMIT)), None]
    assert not (folder / "model.safetensors").exists() and (folder / "model.safetensors.index.json").read_bytes() == b"{}"
    assert (Path(str(with_workers[0])) / "model.safetensors").read_bytes() == WEIGHTS["model.safetensors"]


def test_the_hubs_refusals_say_what_to_do(hub: str, tmp_path: Path) -> None:
    cache = ["--download-dir", str(tmp_path), "-dpl", "0"]
    assert resolve_in_fresh_interpreter(online(hub), ["tiny-org/absent", *cache],
                                        [REPO, "--revision", "v9", *cache], ["tiny-org/gated", *cache]) == [
        "MODEL 'tiny-org/absent' is not a folder nor a hub repository this token may read; check the id, or pass a "
        "token (--hf-token or HF_TOKEN) for a private one.",
        "MODEL 'tiny-org/tiny-vl' has no revision 'v9' on the hub; pass a branch, tag or commit it has.",
        "MODEL 'tiny-org/gated' is a gated hub repository: accept its terms on the hub and pass a token that may "
        "read it (--hf-token or HF_TOKEN)."]


def test_offline_the_environments_cache_serves_a_hit_and_a_miss_says_what_to_do(cache: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    assert resolve_in_fresh_interpreter(env, [REPO, "--revision", "v1", "-dpl", "0"]) == [
        [str(snapshot(cache, REPO, V1)), None]]
    miss = subprocess.run([sys.executable, "-m", "mmfront.cli", "serve", "tiny-org/absent", "--port", "1"],
                          check=False, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert miss.returncode == 2
    assert miss.stderr == (
        "mmfront serve: MODEL 'tiny-org/absent' is not a folder, and the hub repository is not in the Hugging Face "
        "cache (HF_HUB_CACHE) (HF_HUB_OFFLINE is set). Download it where the network allows ('hf download "
        "tiny-org/absent', with --cache-dir for another cache), point --download-dir at the cache holding it, or "
        "pass the model's local folder.\n")
    [branch] = resolve_in_fresh_interpreter(env, [REPO, "--revision", "v2", "-dpl", "0"])
    assert isinstance(branch, str) and "the hub repository at revision 'v2' is not in" in branch
    assert "('hf download tiny-org/tiny-vl --revision v2'" in branch


@pytest.mark.slow
def test_a_hub_id_is_served_end_to_end_by_the_reference_worker(gemma3_weights_dir: Path,
                                                               tmp_path: Path) -> None:
    """The server downloads the repository, weights included, loads the snapshot, its worker the
    same snapshot's weights, and answers under the id."""
    cache = tmp_path / "cache"
    repo = HubRepo()
    repo.add(MAIN, gemma3_weights_dir, "main")
    hub = contextlib.ExitStack()
    env = {**os.environ, **online(hub.enter_context(serve_hub({REPO: repo}))), "OMP_NUM_THREADS": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    port = get_open_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mmfront.cli", "serve", REPO, "--download-dir", str(cache), "--host", "127.0.0.1",
             "--port", str(port), "--mm-processor-cache-gb", "0.05", "--processing-lanes", "0",
             "--uvicorn-log-level", "warning"], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as answer:
            [model] = json.load(answer)["data"]
        assert (model["id"], model["root"]) == (REPO, REPO)
        chat = {"model": REPO, "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_data_url(make_image(40, 32, seed=5))}},
            {"type": "text", "text": "What is this?"}]}]}
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(chat).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            body = json.load(answer)
        assert (body["model"], body["choices"][0]["finish_reason"], body["usage"]["completion_tokens"]) == (
            REPO, "length", 3)
        [worker] = [stat.parent for stat in Path("/proc").glob("[0-9]*/stat")
                    if stat.read_text().rsplit(")", 1)[1].split()[1] == str(process.pid)
                    and b"worker" in (stat.parent / "cmdline").read_bytes()]
        assert str(snapshot(cache, REPO, MAIN)).encode() in (worker / "cmdline").read_bytes().split(b"\0")
    finally:
        process.terminate()
        process.wait(60)
        hub.close()
