"""Tiny, fully offline instances of real HuggingFace multimodal processors.

Real processor classes (``Gemma3Processor``, ``Idefics3Processor``, ``Emu3Processor``,
``Qwen2AudioProcessor``, ``GlmAsrProcessor``) with small image/audio sizes and a locally built,
deterministic byte-level BPE tokenizer, so tests exercise the exact code paths users hit without
any model hub. Ported from ``shared/reference/tiny_processors.py``.

Offsets (``text_replacement_offsets``): Gemma3/Emu3 report them from transformers 5.15.0,
Qwen2-Audio from 5.16.0, Idefics3 and GlmAsr already in 5.14.1 (there only via ``text_kwargs``,
see :func:`offsets_kwargs`).
"""

from __future__ import annotations

import numpy as np

try:  # transformers is noisy about deprecations we exercise on purpose
    from transformers.utils import logging as _hf_logging

    _hf_logging.set_verbosity_error()
except Exception:  # pragma: no cover
    pass

import transformers
from packaging.version import Version
from PIL import Image
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

TF_VERSION = Version(transformers.__version__)
#: transformers >= 5.15: Gemma3/Emu3 (and Qwen2-Audio from 5.16) go through the replacement hooks,
#: and ``return_text_replacement_offsets`` is a declared kwarg (flat kwarg works)
HAS_OFFSETS_API = Version("5.15.0") <= TF_VERSION

# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

#: words that get whole-word merges (with and without the byte-level leading space "Ġ")
_WORDS = (
    "user", "model", "assistant", "system", "User", "Assistant", "Describe", "describe",
    "this", "image", "images", "Here", "is", "the", "original", "and", "here", "are",
    "some", "crops", "to", "help", "you", "see", "better", "What", "what", "in",
    "audio", "Audio", "picture", "Compare", "two", "these", "a", "of",
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (what ByteLevel uses)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _byte_bpe_model(words=_WORDS) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocab (bytes first, in byte order) and deterministic left-to-right word merges."""
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []

    def add_merge(a: str, b: str) -> None:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            merges.append((a, b))

    nl = b2u[ord("\n")]
    add_merge(nl, nl)  # "\n\n" is a single token, like the real tokenizers
    for word in words:
        for form in (word, " " + word):
            mapped = "".join(b2u[b] for b in form.encode("utf-8"))
            current = mapped[0]
            for ch in mapped[1:]:
                add_merge(current, ch)
                current += ch
    return vocab, merges


def make_tokenizer(
    special_tokens: list[str],
    *,
    bos_token: str | None,
    eos_token: str | None,
    pad_token: str | None,
    unk_token: str | None = None,
    extra_special_tokens: dict[str, str] | None = None,
    add_bos: bool = False,
    chat_template: str | None = None,
) -> PreTrainedTokenizerFast:
    """Byte-level BPE tokenizer with ``special_tokens`` as added special tokens.

    Ids: 0..255 are bytes, then the merges, then ``special_tokens`` in order.
    ``extra_special_tokens`` become attributes (``tok.image_token``/``tok.image_token_id``).
    ``add_bos`` installs a TemplateProcessing post-processor prepending ``bos_token``
    when ``add_special_tokens=True`` (as Gemma's tokenizer does).
    """
    vocab, merges = _byte_bpe_model()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    wanted = [t for t in [pad_token, eos_token, bos_token, unk_token] if t] + list(special_tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(wanted)])
    if add_bos:
        bos_id = tok.token_to_id(bos_token)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B", special_tokens=[(bos_token, bos_id)]
        )
    kwargs = {
        "tokenizer_object": tok,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": unk_token,
        "extra_special_tokens": extra_special_tokens or {},
    }
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    return PreTrainedTokenizerFast(**{k: v for k, v in kwargs.items() if v is not None})


def _torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


def _image_processor_class(module: str, name: str, backend: str):
    """``backend``: "pil" (default, no torchvision needed), "torchvision", or "auto"."""
    import importlib

    if backend == "auto":
        backend = "torchvision" if _torchvision_available() else "pil"
    if backend == "pil":
        mod = importlib.import_module(f"transformers.models.{module}.image_processing_pil_{module}")
        return getattr(mod, f"{name}Pil")
    mod = importlib.import_module(f"transformers.models.{module}.image_processing_{module}")
    return getattr(mod, name)


# --------------------------------------------------------------------------------------
# Gemma3
# --------------------------------------------------------------------------------------

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def make_gemma3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
        add_bos=True,  # the real Gemma tokenizer prepends <bos>
        chat_template=GEMMA3_CHAT_TEMPLATE,
    )


def make_gemma3_processor(image_size: int = 32, image_seq_length: int = 16, backend: str = "pil"):
    """Gemma3Processor: real values are 896x896 images and image_seq_length=256.

    The text placeholder is ``<start_of_image>`` (boi); each image expands to
    ``"\\n\\n<start_of_image>" + "<image_soft_token>" * image_seq_length + "<end_of_image>\\n\\n"``.
    Pan-and-scan crops are enabled per call with ``do_pan_and_scan=True`` (and, for
    tiny images, a small ``pan_and_scan_min_crop_size``).
    """
    from transformers import Gemma3Processor

    cls = _image_processor_class("gemma3", "Gemma3ImageProcessor", backend)
    image_processor = cls(size={"height": image_size, "width": image_size})
    return Gemma3Processor(
        image_processor=image_processor,
        tokenizer=make_gemma3_tokenizer(),
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=image_seq_length,
    )


# --------------------------------------------------------------------------------------
# Idefics3 (SmolVLM-style tokens and template)
# --------------------------------------------------------------------------------------

IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}"
    "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

IDEFICS3_ROW_COL_TOKENS = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]


def make_idefics3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *IDEFICS3_ROW_COL_TOKENS],
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        add_bos=False,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


def make_idefics3_processor(
    patch_size: int = 32, max_splits_per_side: int = 2, image_seq_len: int = 4, backend: str = "pil"
):
    """Idefics3Processor: real Idefics3 uses 364px patches, size longest_edge 4*364 and
    image_seq_len=169 (SmolVLM: 512 / 2048 / 64).

    Images are split into up to ``max_splits_per_side`` x ``max_splits_per_side`` tiles of
    ``patch_size`` plus one global tile. ``pixel_values`` is 5-D
    ``[num_prompts, max_tiles_in_any_prompt, 3, patch_size, patch_size]`` (zero-padded across
    prompts), ``pixel_attention_mask`` is ``[num_prompts, max_tiles, patch_size, patch_size]``.
    """
    from transformers import Idefics3Processor

    cls = _image_processor_class("idefics3", "Idefics3ImageProcessor", backend)
    image_processor = cls(
        size={"longest_edge": patch_size * max_splits_per_side},
        max_image_size={"longest_edge": patch_size},
        do_image_splitting=True,
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=make_idefics3_tokenizer(),
        image_seq_len=image_seq_len,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


# --------------------------------------------------------------------------------------
# Emu3
# --------------------------------------------------------------------------------------

EMU3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def make_emu3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<image>", "<|image start|>", "<|image end|>", "<|image token|>", "<|extra_201|>"],
        bos_token="<|extra_203|>",
        eos_token="<|extra_204|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<image>",
            "boi_token": "<|image start|>",
            "eoi_token": "<|image end|>",
            "image_wrapper_token": "<|image token|>",
            "eof_token": "<|extra_201|>",
        },
        add_bos=False,  # Emu3's GPT-style tokenizer adds no BOS; the processor does (5.23: once per sample)
        chat_template=EMU3_CHAT_TEMPLATE,
    )


def make_emu3_processor(min_pixels: int = 16 * 16, max_pixels: int = 64 * 64, spatial_factor: int = 8):
    """Emu3Processor: real values are min_pixels=512*512, max_pixels=1024*1024.

    The processor hard-codes ``downsample_ratio = 8``; an image resized (smart_resize, multiple
    of ``spatial_factor``) to HxW becomes ``<|image start|>{h}*{w}<|image token|>`` +
    ``<image> * h*(w+1)`` + ``<|extra_201|><|image end|>`` with h=H//8, w=W//8.
    ``pixel_values`` of several images are zero-padded (bottom/right) to the largest H and W;
    ``image_sizes`` holds each image's own resized (H, W).
    """
    from transformers import Emu3ImageProcessor, Emu3Processor

    image_processor = Emu3ImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, spatial_factor=spatial_factor)
    return Emu3Processor(image_processor=image_processor, tokenizer=make_emu3_tokenizer(), chat_template=EMU3_CHAT_TEMPLATE)


# --------------------------------------------------------------------------------------
# Qwen2-Audio (audio processor with a replace_audio_token hook in >= 5.15)
# --------------------------------------------------------------------------------------


def make_qwen2_audio_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"],
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "audio_token": "<|AUDIO|>",
            "audio_bos_token": "<|audio_bos|>",
            "audio_eos_token": "<|audio_eos|>",
        },
        add_bos=False,
    )


def make_qwen2_audio_processor(feature_size: int = 16, chunk_length: int = 2, sampling_rate: int = 16000):
    """Qwen2AudioProcessor: real WhisperFeatureExtractor has feature_size=128, chunk_length=30.

    The processor forces ``padding="max_length"``, so ``input_features`` is always
    ``[num_audios, feature_size, chunk_length * sampling_rate // hop_length]`` whatever the
    audio length; ``feature_attention_mask`` ``[num_audios, frames]`` marks the real frames.
    An audio of L frames expands to ``(((L - 1) // 2 + 1) - 2) // 2 + 1`` ``<|AUDIO|>`` tokens.
    The processor's built-in default chat template is kept.
    """
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    feature_extractor = WhisperFeatureExtractor(
        feature_size=feature_size, sampling_rate=sampling_rate, hop_length=160, chunk_length=chunk_length, n_fft=400
    )
    return Qwen2AudioProcessor(feature_extractor=feature_extractor, tokenizer=make_qwen2_audio_tokenizer())


def make_glmasr_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|user|>", "<|assistant|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|pad|>"],
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        add_bos=False,
    )


def make_glmasr_processor(feature_size: int = 16, chunk_length: int = 2, sampling_rate: int = 16000):
    """GlmAsrProcessor: the WhisperFeatureExtractor-based audio processor that has a
    ``replace_audio_token`` hook in *every* version checked (5.14.1, 5.15.0, 5.23.0), so it reports
    offsets even on 5.14.1 (via ``text_kwargs``). Limits: one audio per text sample (``len(text) ==
    len(audio)``), ``return_tensors`` must be "pt" (the default), text is left-padded.
    Each audio is cut into ``chunk_length``-second windows, each padded to ``chunk_length`` seconds.
    Real values: feature_size=128, chunk_length=30, audio_token="<|pad|>".
    """
    from transformers import GlmAsrProcessor, WhisperFeatureExtractor

    feature_extractor = WhisperFeatureExtractor(
        feature_size=feature_size, sampling_rate=sampling_rate, hop_length=160, chunk_length=chunk_length, n_fft=400
    )
    return GlmAsrProcessor(feature_extractor=feature_extractor, tokenizer=make_glmasr_tokenizer(), audio_token="<|pad|>")


# --------------------------------------------------------------------------------------
# Inputs and helpers
# --------------------------------------------------------------------------------------


def make_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), mode="RGB")


def make_audio(seconds: float, sampling_rate: int = 16000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * sampling_rate))).astype(np.float32)


def offsets_kwargs() -> dict:
    """How to ask for ``text_replacement_offsets`` on this transformers version.

    5.15+ (5.23 checked): a top-level processor kwarg (``ProcessingKwargs.return_text_replacement_offsets``;
    the old ``text_kwargs`` spelling still works until 5.29). 5.14.1: it is *not* a declared
    TextKwargs key, so the flat kwarg is dropped with a warning; only
    ``text_kwargs={"return_text_replacement_offsets": True}`` reaches ``__call__`` -- and only
    processors that use ProcessorMixin.__call__ (or Idefics3) honour it.
    """
    if HAS_OFFSETS_API:
        return {"return_text_replacement_offsets": True}
    return {"text_kwargs": {"return_text_replacement_offsets": True}}


def expand_text(text: str, offsets_for_sample: list[dict]) -> str:
    """Rebuild the expanded prompt from the unexpanded one and its reported offsets
    (``span`` indexes ``text``; replacements are applied left to right)."""
    parts, last = [], 0
    for entry in offsets_for_sample:
        start, end = entry["span"]
        parts += [text[last:start], entry["replacement"]]
        last = end
    parts.append(text[last:])
    return "".join(parts)


def token_runs(mask) -> list[tuple[int, int]]:
    """``[start, end)`` runs of non-zero entries (for mm_token_type_ids / token_type_ids /
    ``input_ids == token_id``) -- the transformers<5.15 way of locating placeholders."""
    m = np.asarray(mask).astype(bool).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m, [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def spans_in_tokens(tokenizer, expanded_text: str, offsets_for_sample: list[dict], **tok_kwargs) -> list[tuple[str, int, int]]:
    """Map each reported ``new_span`` (char offsets in the expanded text) to a token range
    ``[start, end)`` with the fast tokenizer's ``char_to_token`` (what Idefics3 does internally).
    The returned BatchFeature has no ``char_to_token``, so the expanded text is re-tokenized."""
    enc = tokenizer(expanded_text, **tok_kwargs)
    out = []
    for entry in offsets_for_sample:
        start, end = entry["new_span"]
        out.append((entry["type"], enc.char_to_token(start), enc.char_to_token(end - 1) + 1))
    return out
