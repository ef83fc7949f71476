"""A Hugging Face hub on loopback, so ``huggingface_hub`` downloads offline and lays its cache out
itself: the few routes ``snapshot_download`` calls (a revision's info, its file tree, each file's
``resolve`` URL, HEAD and GET), answered from local folders, with the hub's error codes for an
unknown repository or revision and for a gated one. Point ``HF_ENDPOINT`` at :func:`serve_hub`'s
address (huggingface_hub reads it when imported, so in a fresh interpreter)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from local_services import serve_http

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Files the hub keeps in LFS: named by their content's sha256, not their git blob id."""


@dataclass
class HubRepo:
    """One model repository: its commits' files, and its branches and tags."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def add(self, commit: str, folder: Path, *refs: str, extra: Mapping[str, bytes] | None = None) -> None:
        """Commit every file of ``folder`` (and ``extra``) as ``commit``, the branches ``refs`` on it."""
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        self.commits[commit] = {**files, **(extra or {})}
        self.refs.update(dict.fromkeys(refs, commit))


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def etag(path: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if path.endswith(LFS_SUFFIXES) else git_blob_id(data)


def handler(repos: Mapping[str, HubRepo]) -> type[BaseHTTPRequestHandler]:
    class Hub(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def refuse(self, status: int, code: str) -> None:
            self.answer(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code,
                                                                        "Content-Type": "application/json"})

        def files(self, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
            repo = repos.get(repo_id)
            if repo is None:
                self.refuse(404, "RepoNotFound")
                return None
            if repo.gated:
                self.refuse(401, "GatedRepo")
                return None
            commit = revision if revision in repo.commits else repo.refs.get(revision)
            if commit is None:
                self.refuse(404, "RevisionNotFound")
                return None
            return commit, repo.commits[commit]

        def do_GET(self) -> None:
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            if parts[:2] == ["api", "models"]:  # /api/models/ORG/NAME/{revision,tree}/REV
                found = self.files("/".join(parts[2:4]), parts[5])
                if found is None:
                    return
                commit, files = found
                if parts[4] == "revision":
                    body: object = {"id": "/".join(parts[2:4]), "sha": commit,
                                    "siblings": [{"rfilename": p} for p in files]}
                else:
                    body = [{"type": "file", "oid": git_blob_id(data), "size": len(data), "path": p,
                             **({"lfs": {"oid": etag(p, data), "size": len(data), "pointerSize": 134}}
                                if p.endswith(LFS_SUFFIXES) else {})} for p, data in files.items()]
                self.answer(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                return
            found = self.files("/".join(parts[:2]), parts[3])  # /ORG/NAME/resolve/REV/PATH
            if found is None:
                return
            commit, files = found
            path = "/".join(parts[4:])
            if path not in files:
                self.refuse(404, "EntryNotFound")
                return
            self.answer(200, files[path], {"X-Repo-Commit": commit, "ETag": f'"{etag(path, files[path])}"'})

        do_HEAD = do_GET

    return Hub


@contextmanager
def serve_hub(repos: Mapping[str, HubRepo]) -> Iterator[str]:
    """``http://127.0.0.1:<port>``, a hub serving ``repos`` (by repository id) until the block ends."""
    with serve_http(handler(repos)) as url:
        yield url
