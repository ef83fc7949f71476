"""``mmfront serve MODEL`` takes a hub id as ``vllm serve`` does: resolved through the local
Hugging Face cache by ``huggingface_hub`` (``--revision`` a branch or a commit, ``--download-dir``
the cache, ``HF_HUB_CACHE``/``HF_HUB_OFFLINE`` from the environment), ``--tokenizer`` a hub id of
its own at ``--tokenizer-revision``, served and reported under the id; an id missing offline ends
the command with exit 2 and a message saying what to do. Everything runs offline, on a cache laid
out as huggingface_hub lays one out (checked first with huggingface_hub's own readers)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hub_cache import add_snapshot
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
REPO = "tiny-org/tiny-vl"
TOKENIZER_REPO = "tiny-org/tiny-tokenizer"


@pytest.fixture(scope="module")
def cache(gemma3_dir: Path, idefics3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding ``REPO`` at two commits (``main``: Gemma 3's folder; ``v1``: Idefics3's)
    and ``TOKENIZER_REPO`` (Idefics3's tokenizer files alone)."""
    root = tmp_path_factory.mktemp("hub") / "cache"
    add_snapshot(root, REPO, gemma3_dir, MAIN)
    add_snapshot(root, REPO, idefics3_dir, V1, refs=("v1",))
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tokenizer / name).write_bytes((idefics3_dir / name).read_bytes())
    add_snapshot(root, TOKENIZER_REPO, tokenizer, TOKENIZER_COMMIT)
    return root


def snapshot(cache: Path, repo: str, commit: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit


def plan(*argv: str) -> ServePlan:
    return plan_from_args(build_parser().parse_args(["serve", *argv]))


def test_huggingface_hub_reads_the_cache_as_its_own(cache: Path) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

    info = scan_cache_dir(cache)
    assert info.warnings == []
    repos = {r.repo_id: r for r in info.repos}
    assert sorted(repos) == [TOKENIZER_REPO, REPO]
    assert {r.commit_hash: set(r.refs) for r in repos[REPO].revisions} == {MAIN: {"main"}, V1: {"v1"}}
    assert {f.file_name for f in next(iter(repos[TOKENIZER_REPO].revisions)).files} == {
        "tokenizer.json", "tokenizer_config.json"}
    assert snapshot_download(REPO, cache_dir=cache, local_files_only=True) == str(snapshot(cache, REPO, MAIN))
    assert snapshot_download(REPO, cache_dir=cache, revision="v1", local_files_only=True) == str(
        snapshot(cache, REPO, V1))
    assert try_to_load_from_cache(REPO, "config.json", cache_dir=cache) == str(
        snapshot(cache, REPO, MAIN) / "config.json")


def test_a_cached_hub_id_is_served_from_its_snapshot_under_its_id(cache: Path) -> None:
    p = plan(REPO, "--download-dir", str(cache), "--data-parallel-size-local", "0")
    assert p.settings.model == REPO and p.settings.model_names == (REPO,)
    assert p.model_folder == snapshot(cache, REPO, MAIN)
    assert json.loads((p.model_folder / "config.json").read_text())["model_type"] == "gemma3"
    assert (p.source.download_dir, p.source.revision) == (str(cache), None)


def test_revision_picks_a_branch_or_a_commit(cache: Path) -> None:
    for revision in ("v1", V1):
        p = plan(REPO, "--download-dir", str(cache), "--revision", revision, "-dpl", "0")
        assert p.model_folder == snapshot(cache, REPO, V1)
        assert json.loads((p.model_folder / "config.json").read_text())["model_type"] == "idefics3"
    assert plan(REPO, "--download-dir", str(cache), "--revision", MAIN, "-dpl", "0").model_folder == snapshot(
        cache, REPO, MAIN)


def test_tokenizer_is_a_hub_id_of_its_own_at_its_own_revision(cache: Path, gemma3_dir: Path) -> None:
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


def test_the_token_is_kept_out_of_the_logged_arguments(cache: Path) -> None:
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


OFFLINE_SCRIPT = """
import json, sys
from mmfront.cli import build_parser
from mmfront.serve.args import plan_from_args
print(json.dumps(str(plan_from_args(build_parser().parse_args(["serve", *sys.argv[1:]])).model_folder)))
"""


def run_offline(cache: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` in a fresh interpreter under ``HF_HUB_OFFLINE=1`` with ``cache`` as ``HF_HUB_CACHE``
    (huggingface_hub reads both when imported)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    return subprocess.run([sys.executable, *argv], check=False, capture_output=True, text=True, env=env, timeout=120)


def test_offline_the_environments_cache_serves_a_hit_and_a_miss_says_what_to_do(cache: Path) -> None:
    hit = run_offline(cache, "-c", OFFLINE_SCRIPT, REPO, "--revision", "v1", "-dpl", "0")
    assert hit.returncode == 0, hit.stderr
    assert json.loads(hit.stdout) == str(snapshot(cache, REPO, V1))
    miss = run_offline(cache, "-m", "mmfront.cli", "serve", "tiny-org/absent", "--port", "1")
    assert miss.returncode == 2
    assert miss.stderr == (
        "mmfront serve: MODEL 'tiny-org/absent' is not a folder, and the hub repository is not in the Hugging Face "
        "cache (HF_HUB_CACHE) (HF_HUB_OFFLINE is set). Download it where the network allows ('hf download "
        "tiny-org/absent', with --cache-dir for another cache), point --download-dir at the cache holding it, or "
        "pass the model's local folder.\n")
    branch = run_offline(cache, "-m", "mmfront.cli", "serve", REPO, "--revision", "v2", "--port", "1")
    assert branch.returncode == 2 and "the hub repository at revision 'v2' is not in" in branch.stderr
    assert "('hf download tiny-org/tiny-vl --revision v2'" in branch.stderr


@pytest.mark.slow
def test_a_hub_id_is_served_end_to_end_by_the_reference_worker(gemma3_weights_dir: Path,
                                                               tmp_path: Path) -> None:
    """The server loads the snapshot, its worker the same snapshot's weights, and answers under the id."""
    cache = tmp_path / "cache"
    add_snapshot(cache, REPO, gemma3_weights_dir, MAIN)
    port = get_open_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
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
