"""A Hugging Face hub cache laid out offline, as ``huggingface_hub`` lays one out when it downloads:
``models--ORG--NAME/blobs/<etag>`` (a file's git blob sha1, or the sha256 of a file the hub stores
in LFS), ``snapshots/<commit>/<path>`` relative symlinks to them, and ``refs/<branch>`` holding the
commit. Tests check that ``huggingface_hub`` reads it back (``scan_cache_dir``,
``snapshot_download`` with ``local_files_only``) before resolving hub ids against it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Files the hub keeps in LFS: their etag is their content's sha256."""


def etag(path: Path) -> str:
    """The etag ``huggingface_hub`` names a blob by."""
    data = path.read_bytes()
    if path.suffix in LFS_SUFFIXES:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def repo_folder(cache: Path, repo_id: str) -> Path:
    """``models--ORG--NAME``, huggingface_hub's folder for a model repository."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def add_snapshot(cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put every file of ``folder`` into ``cache`` as the snapshot ``commit`` of ``repo_id``, the
    branches ``refs`` pointing at it; returns the snapshot folder."""
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        blob = repo / "blobs" / etag(path)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(path.read_bytes())
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
