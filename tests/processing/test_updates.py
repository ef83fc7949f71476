"""Prompt update types: resolution per item, contents and masks, index targets, the encode memo."""

from __future__ import annotations

import pytest
import torch

from mmfront.errors import ConfigError, InputTypeError
from mmfront.fixtures.models.gemma3 import make_gemma3_tokenizer
from mmfront.inputs import PlaceholderRange
from mmfront.processing import updates as updates_mod
from mmfront.processing.updates import (
    PlaceholderFeaturesInfo,
    PromptIndex,
    PromptIndexTargets,
    PromptInsertion,
    PromptReplacement,
    PromptUpdateDetails,
    ResolvedPromptUpdate,
    UpdateMode,
    bind_and_group_updates,
    cached_decode,
    cached_encode,
)


@pytest.fixture(scope="module")
def gemma_tok():
    return make_gemma3_tokenizer()


class CountingTokenizer:
    """Records every encode/decode call, to prove the memo avoids repeats."""

    def __init__(self) -> None:
        self.encodes: list[tuple[str, bool]] = []
        self.decodes: list[list[int]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encodes.append((text, add_special_tokens))
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        self.decodes.append(list(token_ids))
        return "".join(chr(i) for i in token_ids)


class SlotTokenizer:
    """A tokenizer that cannot be weakly referenced (no ``__weakref__`` slot)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls += 1
        return [len(text)]

    def decode(self, token_ids: list[int]) -> str:
        return "x" * len(token_ids)


# --- modes, resolution ------------------------------------------------------------------------


def test_modes_and_contents():
    ins = PromptInsertion("image", [1], [7, 7])
    rep = PromptReplacement("audio", "<a>", "<x>")
    assert (ins.mode, ins.content) == (UpdateMode.INSERT, [7, 7])
    assert (rep.mode, rep.content) == (UpdateMode.REPLACE, "<x>")
    assert UpdateMode.INSERT == "insert" and UpdateMode.REPLACE == "replace"


def test_resolve_plain_values_wraps_content_in_details():
    r = PromptReplacement("image", [32000], [32000, 32000]).resolve(3)
    assert r == ResolvedPromptUpdate(
        modality="image", item_idx=3, mode=UpdateMode.REPLACE, target=[32000],
        content=PromptUpdateDetails(full=[32000, 32000]),
    )
    assert r.content.is_embed is None


def test_resolve_calls_per_item_callables_once():
    calls: list[tuple[str, int]] = []

    def target(i: int) -> list[int]:
        calls.append(("target", i))
        return [100 + i]

    def content(i: int) -> list[int]:
        calls.append(("content", i))
        return [-(i + 1)] * (i + 1)

    upd = PromptInsertion("video", target, content)
    resolved = [upd.resolve(i) for i in range(3)]
    assert [r.target for r in resolved] == [[100], [101], [102]]
    assert [r.content.full for r in resolved] == [[-1], [-2, -2], [-3, -3, -3]]
    assert calls == [("target", 0), ("content", 0), ("target", 1), ("content", 1), ("target", 2), ("content", 2)]


def test_resolve_keeps_details_and_index_targets():
    details = PromptUpdateDetails.select_token_id([5, 9, 5], 9)
    index = PromptIndexTargets.start()
    r = PromptInsertion("image", index, lambda i: details).resolve(0)
    assert r.target is index
    assert r.content is details


def test_resolve_accepts_tuples_as_token_ids():
    r = PromptReplacement("image", (1, 2), (3,)).resolve(0)
    assert r.target == [1, 2] and r.content.full == [3]


@pytest.mark.parametrize(
    ("target", "content", "match"),
    [
        (12, [1], "target must be token ids"),
        ([1], 7, "content must be token ids"),
        (("a",), [1], "target must be token ids"),
        ([1], {"x": 1}, "content must be token ids"),
    ],
)
def test_resolve_rejects_bad_types(target, content, match):
    with pytest.raises(InputTypeError, match=match):
        PromptReplacement("image", target, content).resolve(0)


def test_with_item_idx_shares_content_and_returns_self_when_unchanged():
    r = PromptReplacement("image", [1], PromptUpdateDetails.select_token_id([1, 2], 2)).resolve(0)
    moved = r.with_item_idx(4)
    assert moved.item_idx == 4 and moved.content is r.content and moved.target is r.target
    assert r.item_idx == 0
    assert r.with_item_idx(0) is r


def test_resolved_update_is_frozen():
    r = PromptReplacement("image", [1], [2]).resolve(0)
    with pytest.raises(AttributeError):
        r.item_idx = 1  # type: ignore[misc]


def test_bind_and_group_updates_orders_by_counts_and_resolves_every_item():
    ups = [
        PromptReplacement("image", [1], lambda i: [10 + i]),
        PromptInsertion("audio", PromptIndexTargets.end(), [20]),
        PromptReplacement("image", [2], [30]),  # a second alternative for every image
    ]
    grouped = bind_and_group_updates(ups, {"audio": 1, "image": 2, "video": 1})
    assert list(grouped) == ["audio", "image", "video"]
    assert [[u.content.full for u in alts] for alts in grouped["image"]] == [[[10], [30]], [[11], [30]]]
    assert [[u.item_idx for u in alts] for alts in grouped["image"]] == [[0, 0], [1, 1]]
    assert len(grouped["audio"]) == 1 and grouped["audio"][0][0].mode is UpdateMode.INSERT
    assert grouped["video"] == [[]]


# --- contents and masks -----------------------------------------------------------------------


def test_from_seq_has_no_mask():
    d = PromptUpdateDetails.from_seq([1, 2, 3])
    assert d.full == [1, 2, 3] and d.embed_mask([1, 2, 3]) is None


def test_select_token_id_mask_is_exact():
    d = PromptUpdateDetails.select_token_id([108, 255999, 7, 7, 7, 256000, 108], 7)
    mask = d.embed_mask(d.full)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [False, False, True, True, True, False, False]


def test_select_token_ids_mask_uses_membership():
    d = PromptUpdateDetails.select_token_ids([1, 2, 3, 2, 4], [2, 4])
    assert d.embed_mask(d.full).tolist() == [False, True, False, True, True]


def test_embed_mask_is_computed_once_per_content():
    calls = []

    def is_embed(ids: list[int]) -> torch.Tensor:
        calls.append(list(ids))
        return torch.tensor(ids) > 0

    d = PromptUpdateDetails(full=[1, -1, 2], is_embed=is_embed)
    first = d.embed_mask(d.full)
    assert d.embed_mask([1, -1, 2]) is first  # an equal list hits the memo too
    assert calls == [[1, -1, 2]]
    assert d.embed_mask([5]).tolist() == [True]
    assert calls == [[1, -1, 2], [5]]


def test_embed_mask_casts_to_bool():
    d = PromptUpdateDetails(full=[1, 0, 1], is_embed=torch.tensor)
    assert d.embed_mask(d.full).dtype == torch.bool


@pytest.mark.parametrize("bad", [lambda ids: [True] * len(ids), lambda ids: torch.ones(len(ids) + 1, dtype=torch.bool)])
def test_embed_mask_rejects_wrong_shapes(bad):
    d = PromptUpdateDetails(full=[1, 2], is_embed=bad)
    with pytest.raises(InputTypeError, match="one entry per content token"):
        d.embed_mask([1, 2])


def test_details_built_the_same_way_compare_equal():
    assert PromptUpdateDetails.select_token_id([1, 2], 2) == PromptUpdateDetails.select_token_id([1, 2], 2)
    assert PromptUpdateDetails.select_token_id([1, 2], 2) != PromptUpdateDetails.select_token_id([1, 2], 1)


def test_text_content_token_ids_use_the_tokenizer_without_special_tokens(gemma_tok):
    boi, img = gemma_tok.convert_tokens_to_ids(["<start_of_image>", "<image_soft_token>"])
    d = PromptUpdateDetails.select_token_id("<start_of_image><image_soft_token><image_soft_token>", img)
    ids = d.token_ids(gemma_tok)
    assert ids == [boi, img, img]  # no <bos> prepended
    assert d.embed_mask(ids).tolist() == [False, True, True]


# --- index targets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "start", "prefix", "end"),
    [
        ([], 0, None, 0),
        ([32000], 0, 1, 1),
        ([32000, 32000, 32000, 32000], 0, 1, 4),
        ([9833, 28747, 32000], 0, None, 3),
    ],
)
def test_index_targets_in_token_space(prompt, start, prefix, end):
    assert PromptIndexTargets.start().get_match_index(None, prompt) == start
    assert PromptIndexTargets.prefix([32000]).get_match_index(None, prompt) == prefix
    assert PromptIndexTargets.end().get_match_index(None, prompt) == end


@pytest.mark.parametrize(
    ("prompt", "start", "prefix", "end"),
    [
        ("", 0, None, 0),
        ("<image>", 0, 7, 7),
        ("<image><image>", 0, 7, 14),
        ("Image:<image>", 0, None, 13),
    ],
)
def test_index_targets_in_text_space(prompt, start, prefix, end):
    assert PromptIndexTargets.start().get_match_index(None, prompt) == start
    assert PromptIndexTargets.prefix("<image>").get_match_index(None, prompt) == prefix
    assert PromptIndexTargets.end().get_match_index(None, prompt) == end


def test_prefix_only_matches_from_the_start():
    prefix = PromptIndexTargets.prefix([1, 2])
    assert prefix.get_match_index(None, [1, 2, 3], 0) == 2
    assert prefix.get_match_index(None, [1, 2, 3], 1) is None
    assert PromptIndexTargets.prefix([]).get_match_index(None, [5], 0) == 0


def test_prefix_converts_between_token_and_text_space(gemma_tok):
    prompt_ids = gemma_tok.encode("Describe this")  # <bos> prepended
    assert prompt_ids[0] == gemma_tok.bos_token_id and len(prompt_ids) == 4
    by_text = PromptIndexTargets.prefix("<bos>Describe")
    assert by_text.get_match_index(gemma_tok, prompt_ids) == 2
    by_ids = PromptIndexTargets.prefix(prompt_ids[:2])
    assert by_ids.get_match_index(gemma_tok, "<bos>Describe this") == len("<bos>Describe")
    assert by_ids.get_match_index(gemma_tok, "Describe this") is None


def test_prefix_accepts_tuple_ids():
    assert PromptIndexTargets.prefix((1, 2)).get_match_index(None, [1, 2]) == 2


def test_index_targets_compare_by_identity():
    a, b = PromptIndexTargets.start(), PromptIndexTargets.start()
    assert a == a and a != b


def test_custom_prompt_index():
    after_first_7 = PromptIndex(lambda tok, prompt, start_idx=0: prompt.index(7) + 1 if 7 in prompt else None)
    assert after_first_7.get_match_index(None, [1, 7, 7]) == 2


# --- encode/decode memo -----------------------------------------------------------------------


def test_cached_encode_calls_the_tokenizer_once_per_text():
    tok = CountingTokenizer()
    a = cached_encode(tok, "<image>")
    b = cached_encode(tok, "<image>")
    assert a == [ord(c) for c in "<image>"] and b is a
    assert tok.encodes == [("<image>", False)]
    cached_encode(tok, "<audio>")
    assert len(tok.encodes) == 2


def test_memo_is_per_tokenizer():
    t1, t2 = CountingTokenizer(), CountingTokenizer()
    cached_encode(t1, "x")
    cached_encode(t2, "x")
    assert t1.encodes == [("x", False)] and t2.encodes == [("x", False)]


def test_cached_decode_memoizes_by_ids():
    tok = CountingTokenizer()
    assert cached_decode(tok, [104, 105]) == "hi"
    assert cached_decode(tok, (104, 105)) == "hi"
    assert tok.decodes == [[104, 105]]


def test_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(updates_mod, "_MEMO_MAXSIZE", 3)
    tok = CountingTokenizer()
    for text in "abc":
        cached_encode(tok, text)
    cached_encode(tok, "c")
    assert len(updates_mod._ENCODE_MEMO[tok]) == 3
    cached_encode(tok, "d")  # the full memo starts over with "d"
    assert updates_mod._ENCODE_MEMO[tok] == {"d": [ord("d")]}
    cached_encode(tok, "a")
    assert [t for t, _ in tok.encodes] == ["a", "b", "c", "d", "a"]


def test_memo_is_dropped_with_the_tokenizer():
    tok = CountingTokenizer()
    cached_encode(tok, "x")
    assert tok in updates_mod._ENCODE_MEMO
    before = len(updates_mod._ENCODE_MEMO)
    del tok
    assert len(updates_mod._ENCODE_MEMO) == before - 1


def test_unweakrefable_tokenizer_still_encodes():
    tok = SlotTokenizer()
    assert cached_encode(tok, "abc") == [3]
    assert cached_encode(tok, "abc") == [3]
    assert tok.calls == 2


def test_text_without_tokenizer_is_a_config_error():
    with pytest.raises(ConfigError, match="tokenizer is needed"):
        cached_encode(None, "<image>")
    with pytest.raises(ConfigError, match="tokenizer is needed"):
        cached_decode(None, [1])


# --- placeholders -----------------------------------------------------------------------------


def test_placeholder_to_range():
    mask = torch.tensor([False, True, True])
    info = PlaceholderFeaturesInfo("image", 1, 5, [1, 2, 2], mask)
    assert info.length == 3
    assert info.to_range() == PlaceholderRange(offset=5, length=3, is_embed=mask)
    assert PlaceholderFeaturesInfo("audio", 0, 2, [9], None).to_range() == PlaceholderRange(offset=2, length=1)


def test_placeholder_equality_compares_masks_by_value():
    a = PlaceholderFeaturesInfo("image", 0, 1, [1, 2], torch.tensor([False, True]))
    assert a == PlaceholderFeaturesInfo("image", 0, 1, [1, 2], torch.tensor([False, True]))
    assert a != PlaceholderFeaturesInfo("image", 0, 1, [1, 2], torch.tensor([True, True]))
    assert a != PlaceholderFeaturesInfo("image", 0, 1, [1, 2], None)
    assert a != PlaceholderFeaturesInfo("image", 0, 2, [1, 2], torch.tensor([False, True]))
