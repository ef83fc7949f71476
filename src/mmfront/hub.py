"""Where a model's files come from: ``vllm serve MODEL`` takes a local folder or a Hugging Face
hub id, and so does ``mmfront serve``. A hub id is resolved with ``huggingface_hub`` itself
(``snapshot_download``), so its cache layout, ``--revision`` (a branch, tag or commit),
``--download-dir`` (the cache to use), ``--hf-token`` and the ``HF_HUB_OFFLINE``/``HF_HUB_CACHE``
environment mean what they mean to vLLM: a repository already in the cache is served without
the network, one missing is downloaded where the network allows it.

The API server reads the configuration, processor, tokenizer and chat template, not the
weights: those are left to the engines (vLLM's download them into the same cache), unless the
engines are mmfront's reference workers, which load them from the folder the server resolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mmfront.errors import ModelFilesNotFoundError
from mmfront.flags import flag

WEIGHT_FILE_PATTERNS = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack", "*.onnx", "*.onnx_data",
    # large assets that tokenizers and processors never read
    "*.png", "*.jpg", "*.jpeg", "*.gif", "*.webp", "*.mp3", "*.mp4", "*.wav", "*.flac", "*.parquet", "*.arrow",
    "*.ipynb", "*.zip", "*.tar*",
)
"""The files left out when only the API server's files are needed: vLLM 0.33's own list
(``_WEIGHT_FILE_PATTERNS`` of ``vllm.transformers_utils.repo_utils``, which its API server's
``get_non_weight_snapshot_path`` leaves out the same way), so both fetch the same files."""


@dataclass(frozen=True)
class ModelSource:
    """How ``MODEL`` and ``--tokenizer`` are found when they are hub ids (vLLM's ``ModelConfig``
    and ``LoadConfig`` flags of the same names)."""

    revision: str | None = field(default=None, metadata=flag(metavar="REV"))
    """The hub revision of a hub id ``MODEL``: a branch, tag or commit (``None``: ``main``)."""
    tokenizer_revision: str | None = field(default=None, metadata=flag(metavar="REV"))
    """The hub revision of a hub id ``--tokenizer`` (``None``: ``main``)."""
    download_dir: str | None = field(default=None, metadata=flag(metavar="DIR"))
    """The Hugging Face cache hub ids are read from and downloaded into (``None``: huggingface_hub's,
    ``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``)."""
    hf_token: str | None = field(default=None, repr=False, metadata=flag(metavar="TOKEN"))
    """The token a download of a private or gated repository sends (``None``: huggingface_hub's,
    ``HF_TOKEN`` or the one ``hf auth login`` stored)."""


def resolve_model_folder(model: str | Path, *, revision: str | None = None, download_dir: str | Path | None = None,
                         token: str | None = None, weights: bool = False, flag_name: str = "MODEL") -> Path:
    """The local folder holding ``model``'s files: ``model`` itself when it is a folder, else the
    snapshot of the hub repository ``model`` names in the Hugging Face cache (``download_dir``, or
    huggingface_hub's default), downloaded first where it is missing and the network is allowed
    (not under ``HF_HUB_OFFLINE=1``). ``weights``: the weight files too (a reference worker loads
    them; vLLM's engines download their own). Raises :class:`~mmfront.errors.ModelFilesNotFoundError`
    saying what to do, naming ``flag_name``, when neither is found."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    repo_id = str(model)
    if path.exists():
        raise ModelFilesNotFoundError(f"{flag_name} {repo_id!r} is a file; pass the model's folder or a hub id.")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=download_dir, token=token,
                                   local_files_only=constants.HF_HUB_OFFLINE,
                                   ignore_patterns=None if weights else list(WEIGHT_FILE_PATTERNS))
    except HFValidationError as e:
        raise ModelFilesNotFoundError(f"{flag_name} {repo_id!r} is neither a folder nor a hub id (ORG/NAME): "
                                      f"{e}") from e
    except LocalEntryNotFoundError as e:
        cache = f"--download-dir {download_dir}" if download_dir is not None else "the Hugging Face cache (HF_HUB_CACHE)"
        at = f" at revision {revision!r}" if revision is not None else ""
        why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
               else f"the hub could not be reached: {type(e.__cause__ or e).__name__}: {e.__cause__ or e}")
        raise ModelFilesNotFoundError(
            f"{flag_name} {repo_id!r} is not a folder, and the hub repository{at} is not in {cache} ({why}). "
            f"Download it where the network allows ('hf download {repo_id}"
            f"{'' if revision is None else ' --revision ' + revision}', with --cache-dir for another cache), point "
            "--download-dir at the cache holding it, or pass the model's local folder.") from e
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as e:
        what = ("is a gated hub repository: accept its terms on the hub and pass a token that may read it "
                "(--hf-token or HF_TOKEN)" if isinstance(e, GatedRepoError)
                else f"has no revision {revision!r} on the hub; pass a branch, tag or commit it has"
                if isinstance(e, RevisionNotFoundError)
                else "is not a folder nor a hub repository this token may read; check the id, or pass a token "
                     "(--hf-token or HF_TOKEN) for a private one")
        raise ModelFilesNotFoundError(f"{flag_name} {repo_id!r} {what}.") from e
    except OSError as e:
        raise ModelFilesNotFoundError(f"{flag_name} {repo_id!r}: the hub repository could not be downloaded: "
                                      f"{type(e).__name__}: {e}") from e
    return Path(folder)


def resolve_tokenizer_folder(tokenizer: str | None, source: ModelSource) -> str | None:
    """``--tokenizer`` as a local folder (``None`` stays ``None``: the model's own), resolved as
    :func:`resolve_model_folder` resolves ``MODEL``, at ``--tokenizer-revision``."""
    if tokenizer is None:
        return None
    return str(resolve_model_folder(tokenizer, revision=source.tokenizer_revision, download_dir=source.download_dir,
                                    token=source.hf_token, flag_name="--tokenizer"))


__all__ = ["WEIGHT_FILE_PATTERNS", "ModelSource", "resolve_model_folder", "resolve_tokenizer_folder"]
