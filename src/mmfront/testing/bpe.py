"""Deterministic byte-level BPE tokenizers, built offline (no training, no files read).

256 byte tokens (GPT-2's byte -> unicode alphabet), a ``"\\n\\n"`` merge, and left-to-right
whole-word merges for a few dozen prompt words; special tokens are real added special tokens.
Wrapped as ``PreTrainedTokenizerFast``, they ``save_pretrained`` / ``from_pretrained`` like any
HF tokenizer. :func:`gemma3_real_bpe` lays the same tokens out at Gemma 3's real ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from mmfront.errors import ConfigError

__all__ = [
    "GEMMA3_REAL_IDS",
    "GEMMA3_VOCAB_SIZE",
    "BPEModel",
    "byte_bpe_model",
    "byte_token",
    "gemma3_real_bpe",
    "make_tokenizer",
]

#: words that get whole-word merges (with and without the byte-level leading space "Ġ")
_WORDS = (
    "user", "model", "assistant", "system", "User", "Assistant", "Describe", "describe",
    "this", "image", "images", "Here", "is", "the", "original", "and", "here", "are",
    "some", "crops", "to", "help", "you", "see", "better", "What", "what", "in",
    "audio", "Audio", "picture", "Compare", "two", "these", "a", "of",
)


@dataclass(frozen=True)
class BPEModel:
    """A byte-level BPE vocabulary: ``vocab`` maps token -> id, ``merges`` are in rank order."""

    vocab: dict[str, int]
    merges: list[tuple[str, str]]


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


def byte_token(text: str) -> str:
    """``text`` spelled in the byte-level alphabet (``"\\n"`` -> ``"Ċ"``), as vocab keys are."""
    b2u = _bytes_to_unicode()
    return "".join(b2u[b] for b in text.encode("utf-8"))


def byte_bpe_model(words: tuple[str, ...] = _WORDS, *, gemma_newlines: bool = False) -> BPEModel:
    """Bytes first (in byte order), then deterministic left-to-right word merges; no training.

    ``"\\n\\n"`` is always one token, as in the real tokenizers. ``gemma_newlines`` adds
    ``"\\n\\n\\n"`` and ``"\\n\\n\\n\\n"`` right after it, because Gemma's vocabulary has them
    and mmfront's native Gemma3 processor merges spliced newlines into them (vLLM does too).
    """
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []

    def add_merge(a: str, b: str) -> None:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            merges.append((a, b))

    nl = b2u[ord("\n")]
    add_merge(nl, nl)
    if gemma_newlines:
        add_merge(nl * 2, nl)
        add_merge(nl * 2, nl * 2)
    for word in words:
        for form in (word, " " + word):
            mapped = byte_token(form)
            current = mapped[0]
            for ch in mapped[1:]:
                add_merge(current, ch)
                current += ch
    return BPEModel(vocab, merges)


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
    gemma_newlines: bool = False,
    bpe: BPEModel | None = None,
) -> PreTrainedTokenizerFast:
    """Byte-level BPE tokenizer with ``special_tokens`` as added special tokens.

    Ids: 0..255 are bytes, then the merges, then ``special_tokens`` in order -- unless ``bpe``
    already holds a token, which then keeps its id there (how real-id vocabularies are built).
    ``extra_special_tokens`` become attributes (``tok.image_token``/``tok.image_token_id``).
    ``add_bos`` installs a TemplateProcessing post-processor prepending ``bos_token``
    when ``add_special_tokens=True`` (as Gemma's tokenizer does).

    ``gemma_newlines`` makes runs of 3 and 4 newlines single tokens and turns off GPT-2's
    pre-tokenizer regex: that regex splits ``"\\n\\nText"`` into ``"\\n" "\\n" "Text"``, while
    Gemma's tokenizer (no pre-split) keeps ``"\\n\\n"`` whole, so HF's tokenization of an
    expanded Gemma3 prompt would otherwise differ from a spliced one at every image seam.
    Ordinary text tokenizes the same either way (no merge crosses a word boundary).
    """
    model = bpe or byte_bpe_model(gemma_newlines=gemma_newlines)
    tok = Tokenizer(models.BPE(vocab=model.vocab, merges=model.merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not gemma_newlines)
    tok.decoder = decoders.ByteLevel()
    wanted = [t for t in [pad_token, eos_token, bos_token, unk_token] if t] + list(special_tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(wanted)])
    if add_bos:
        if bos_token is None:
            raise ConfigError("make_tokenizer(add_bos=True) needs a bos_token: pass bos_token=... or add_bos=False")
        bos_id = tok.token_to_id(bos_token)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B", special_tokens=[(bos_token, bos_id)]
        )
    kwargs: dict[str, Any] = {
        "tokenizer_object": tok,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": unk_token,
        "extra_special_tokens": extra_special_tokens or {},
        "chat_template": chat_template,
    }
    return PreTrainedTokenizerFast(**{k: v for k, v in kwargs.items() if v is not None})


#: Gemma 3's real ids for its special and newline tokens (``<mask>`` fills id 4 as in Gemma 3).
GEMMA3_REAL_IDS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<start_of_turn>": 105,
    "<end_of_turn>": 106,
    "\n": 107,
    "\n\n": 108,
    "\n\n\n": 109,
    "\n\n\n\n": 110,
    "<start_of_image>": 255999,
    "<end_of_image>": 256000,
    "<image_soft_token>": 262144,
}
#: Gemma 3's vocabulary size (262144 text tokens + ``<image_soft_token>``).
GEMMA3_VOCAB_SIZE = 262145


def gemma3_real_bpe() -> BPEModel:
    """The Gemma3 vocabulary of :func:`byte_bpe_model` with every :data:`GEMMA3_REAL_IDS` token at
    its real id, padded with ``<unusedN>`` to :data:`GEMMA3_VOCAB_SIZE` so vocab-size costs
    (``get_vocab``, id validation, tokenizer load) are realistic. The other tokens fill the free
    ids from 0 up in their :func:`byte_bpe_model` order."""
    base = byte_bpe_model(gemma_newlines=True)
    vocab = {byte_token(t) if t.startswith("\n") else t: i for t, i in GEMMA3_REAL_IDS.items()}
    taken = set(vocab.values())
    free = (i for i in range(GEMMA3_VOCAB_SIZE) if i not in taken)
    for token in sorted(base.vocab, key=base.vocab.__getitem__):
        if token not in vocab:
            vocab[token] = next(free)
    vocab.update({f"<unused{n}>": i for n, i in enumerate(free)})
    return BPEModel(vocab, base.merges)
