"""Matching, planning, applying and finding prompt updates (vLLM 0.33 test_processing.py cases + more)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.errors import PromptUpdateError
from mmfront.fixtures.models.gemma3 import make_gemma3_tokenizer
from mmfront.processing._matching import (
    PromptTargetMatch,
    iter_target_text_matches,
    iter_target_token_matches,
    iter_token_matches,
    replace_token_matches,
)
from mmfront.processing._placeholders import find_mm_placeholders
from mmfront.processing._splicing import apply_prompt_updates, apply_text_matches, apply_token_matches
from mmfront.processing.updates import (
    PlaceholderFeaturesInfo,
    PromptIndexTargets,
    PromptInsertion,
    PromptReplacement,
    PromptUpdateDetails,
)

PH = PlaceholderFeaturesInfo
LONG = [9833, 28747, 32000, 32000, 32000, 9833, 28747, 32000, 32000, 918]


def updates(update_type, target_by_key, content_by_key, count):
    """``{key: [[update.resolve(i)] for each of count items]}``, one modality per key."""
    return {
        key: [[update_type(key, target, content_by_key[key]).resolve(i)] for i in range(count)]
        for key, target in target_by_key.items()
    }


def m(*pairs):
    return [PromptTargetMatch(a, b) for a, b in pairs]


@pytest.fixture(scope="module")
def tok():
    return make_gemma3_tokenizer()


# --- iter_token_matches -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_ids", "match_ids", "expected"),
    [
        ([], [], []),
        ([], [32000], []),
        ([32000, 32000, 32000], [32000], m((0, 1), (1, 2), (2, 3))),
        ([32000, 32000, 32000], [32000, 32000], m((0, 2))),
        ([32000, 32000, 32000], [32000, 32000, 32000], m((0, 3))),
        (LONG, [28747, 32000], m((1, 3), (6, 8))),
        (LONG, [28747, 32000, 32000, 32000], m((1, 5))),
        (LONG, [28747, 0, 32000], []),
        ([1, 2, 3], [], []),
    ],
)
def test_iter_token_matches(token_ids, match_ids, expected):
    result = list(iter_token_matches(token_ids, match_ids))
    assert result == expected
    assert all(end - start == len(match_ids) for start, end in result)


@pytest.mark.parametrize(
    ("token_ids", "match_ids", "start_idx", "expected"),
    [
        (LONG, [28747, 32000], 0, m((1, 3), (6, 8))),
        (LONG, [28747, 32000], 4, m((6, 8))),
        (LONG, [28747, 32000], 8, []),
        ([32000] * 10, [32000, 32000], 0, m((0, 2), (2, 4), (4, 6), (6, 8), (8, 10))),
        ([32000] * 10, [32000, 32000], 4, m((4, 6), (6, 8), (8, 10))),
        ([32000] * 10, [32000, 32000], 5, m((5, 7), (7, 9))),
        ([32000] * 10, [32000, 32000], 8, m((8, 10))),
        ([32000] * 3, [32000], 4, []),
        ([32000] * 3, [32000], 8, []),
    ],
)
def test_iter_token_matches_from_start_idx(token_ids, match_ids, start_idx, expected):
    assert list(iter_token_matches(token_ids, match_ids, start_idx=start_idx)) == expected


def test_iter_token_matches_negative_start_raises():
    with pytest.raises(ValueError, match="start_idx must be non-negative"):
        list(iter_token_matches([1, 2], [1], start_idx=-1))
    with pytest.raises(ValueError, match="start_idx must be non-negative"):
        list(iter_target_token_matches([1, 2], [1], start_idx=-1))


def test_iter_token_matches_accepts_tuples():
    assert list(iter_token_matches((1, 2, 1, 2), (1, 2))) == m((0, 2), (2, 4))


def test_iter_token_matches_checks_the_whole_slice():
    # first and last tokens agree, a middle one does not
    assert list(iter_token_matches([5, 1, 5, 5, 5, 5], [5, 0, 5])) == []
    assert list(iter_token_matches([5, 1, 5, 5, 0, 5], [5, 0, 5])) == m((3, 6))


# --- replace_token_matches --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_ids", "match_ids", "new_ids", "expected"),
    [
        ([], [], [-1], []),
        ([], [32000], [-1], []),
        ([32000, 32000, 32000], [32000], [-1], [-1, -1, -1]),
        ([32000, 32000, 32000], [32000, 32000], [-1], [-1, 32000]),
        ([32000, 32000, 32000], [32000, 32000, 32000], [-1], [-1]),
        (LONG, [28747, 32000], [-1], [9833, -1, 32000, 32000, 9833, -1, 32000, 918]),
        (LONG, [28747, 32000, 32000, 32000], [-1], [9833, -1, 9833, 28747, 32000, 32000, 918]),
        (LONG, [28747, 0, 32000], [-1], LONG),
        ([1, 2, 1], [1], [], [2]),
    ],
)
def test_replace_token_matches(token_ids, match_ids, new_ids, expected):
    before = list(token_ids)
    assert replace_token_matches(token_ids, match_ids, new_ids) == expected
    assert token_ids == before


# --- target matching: sequences and index targets ---------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "target_by_key", "expected_by_key"),
    [
        (
            [],
            {
                "pattern_1": [],
                "pattern_2": [32000],
                "pattern_3": PromptIndexTargets.start(),
                "pattern_4": PromptIndexTargets.prefix([32000]),
                "pattern_5": PromptIndexTargets.end(),
            },
            {"pattern_1": [], "pattern_2": [], "pattern_3": m((0, 0)), "pattern_4": [], "pattern_5": m((0, 0))},
        ),
        (
            [32000, 32000, 32000, 32000],
            {
                "pattern_1": [32000],
                "pattern_2": [32000, 32000],
                "pattern_3": [32000, 32000, 32000],
                "pattern_4": PromptIndexTargets.start(),
                "pattern_5": PromptIndexTargets.prefix([32000]),
                "pattern_6": PromptIndexTargets.end(),
            },
            {
                "pattern_1": m((0, 1), (1, 2), (2, 3), (3, 4)),
                "pattern_2": m((0, 2), (2, 4)),
                "pattern_3": m((0, 3)),
                "pattern_4": m((0, 0)),
                "pattern_5": m((1, 1)),
                "pattern_6": m((4, 4)),
            },
        ),
        (
            LONG,
            {
                "pattern_1": [28747, 32000],
                "pattern_2": [28747, 32000, 32000, 32000],
                "pattern_3": [28747, 0, 32000],
                "pattern_4": PromptIndexTargets.start(),
                "pattern_5": PromptIndexTargets.prefix([28747, 32000]),
                "pattern_6": PromptIndexTargets.end(),
            },
            {
                "pattern_1": m((1, 3), (6, 8)),
                "pattern_2": m((1, 5)),
                "pattern_3": [],
                "pattern_4": m((0, 0)),
                "pattern_5": [],
                "pattern_6": m((10, 10)),
            },
        ),
    ],
)
@pytest.mark.parametrize("update_type", [PromptInsertion, PromptReplacement])
def test_find_token_matches(prompt, target_by_key, expected_by_key, update_type):
    for key, target in target_by_key.items():
        resolved = update_type(key, target, []).resolve(0)
        assert list(iter_target_token_matches(prompt, resolved.target)) == expected_by_key[key], key


@pytest.mark.parametrize(
    ("prompt", "target_by_key", "expected_by_key"),
    [
        (
            "",
            {
                "pattern_1": "",
                "pattern_2": "<image>",
                "pattern_3": PromptIndexTargets.start(),
                "pattern_4": PromptIndexTargets.prefix("<image>"),
                "pattern_5": PromptIndexTargets.end(),
            },
            # an empty target never matches (the same rule as on the token path)
            {"pattern_1": [], "pattern_2": [], "pattern_3": m((0, 0)), "pattern_4": [], "pattern_5": m((0, 0))},
        ),
        (
            "<image><image><image><image>",
            {
                "pattern_1": "<image>",
                "pattern_2": "<image><image>",
                "pattern_3": "<image><image><image>",
                "pattern_4": PromptIndexTargets.start(),
                "pattern_5": PromptIndexTargets.prefix("<image>"),
                "pattern_6": PromptIndexTargets.end(),
            },
            {
                "pattern_1": m((0, 7), (7, 14), (14, 21), (21, 28)),
                "pattern_2": m((0, 14), (14, 28)),
                "pattern_3": m((0, 21)),
                "pattern_4": m((0, 0)),
                "pattern_5": m((7, 7)),
                "pattern_6": m((28, 28)),
            },
        ),
        (
            "Image:<image><image><image>Image:<image><image>!",
            {
                "pattern_1": "Image:<image>",
                "pattern_2": "Image:<image><image><image>",
                "pattern_3": "Image:<unk><image>",
                "pattern_4": PromptIndexTargets.start(),
                "pattern_5": PromptIndexTargets.prefix("Image:<image>"),
                "pattern_6": PromptIndexTargets.end(),
            },
            {
                "pattern_1": m((0, 13), (27, 40)),
                "pattern_2": m((0, 27)),
                "pattern_3": [],
                "pattern_4": m((0, 0)),
                "pattern_5": m((13, 13)),
                "pattern_6": m((48, 48)),
            },
        ),
        (  # regex metacharacters are plain text
            "<|image|><image><|image|><image>",
            {"pattern_1": "<|image|>", "pattern_2": "<|image|><image>", "pattern_3": "<|image|><image><|image|>"},
            {"pattern_1": m((0, 9), (16, 25)), "pattern_2": m((0, 16), (16, 32)), "pattern_3": m((0, 25))},
        ),
    ],
)
@pytest.mark.parametrize("update_type", [PromptInsertion, PromptReplacement])
def test_find_text_matches(prompt, target_by_key, expected_by_key, update_type):
    for key, target in target_by_key.items():
        resolved = update_type(key, target, []).resolve(0)
        assert list(iter_target_text_matches(prompt, resolved.target)) == expected_by_key[key], key


def test_text_matches_decode_token_targets(tok):
    boi = tok.convert_tokens_to_ids("<start_of_image>")
    text = "a <start_of_image> b <start_of_image>"
    assert list(iter_target_text_matches(text, [boi], tok)) == m((2, 18), (21, 37))
    assert list(iter_target_text_matches(text, [boi], tok, start_idx=3)) == m((21, 37))


# --- applying: the vLLM tables ----------------------------------------------------------------

TEXT_CASES = [
    (
        "Image:<image>Image:<image><image>!",
        # `<image>` before `Image:` tests matches that occur out of order; the first content
        # contains its own target; the second is empty; the third is not `unit * count`
        {"pattern_1": "<image>", "pattern_2": "Image:", "pattern_3": "!"},
        {"pattern_1": "<image><image>", "pattern_2": "", "pattern_3": "?!?"},
        {
            PromptInsertion: {
                0: "Image:<image>Image:<image><image>!",
                1: "Image:<image><image><image>Image:<image><image>!?!?",
                2: "Image:<image><image><image><image><image>Image:<image><image>!?!??!?",
            },
            PromptReplacement: {
                0: "Image:<image>Image:<image><image>!",
                1: "<image><image>Image:<image><image>?!?",
                2: "<image><image><image><image><image>?!?",
            },
        },
    ),
    (
        "",
        {
            "pattern_1": PromptIndexTargets.start(),
            "pattern_2": PromptIndexTargets.prefix("<image>"),
            "pattern_3": PromptIndexTargets.end(),
        },
        {"pattern_1": "1", "pattern_2": "2", "pattern_3": "3"},
        {
            PromptInsertion: {0: "", 1: "13", 2: "1133"},
            PromptReplacement: {0: "", 1: "13", 2: "1133"},
        },
    ),
    (
        "<image>",
        {
            "pattern_1": PromptIndexTargets.start(),
            "pattern_2": PromptIndexTargets.prefix("<image>"),
            "pattern_3": PromptIndexTargets.end(),
        },
        {"pattern_1": "1", "pattern_2": "2", "pattern_3": "3"},
        {
            PromptInsertion: {0: "<image>", 1: "1<image>23", 2: "11<image>2233"},
            PromptReplacement: {0: "<image>", 1: "1<image>23", 2: "11<image>2233"},
        },
    ),
    (
        "<image><image><image>",
        {"pattern_1": "<image>"},
        {"pattern_1": lambda idx: str(idx + 1)},
        {
            PromptInsertion: {0: "<image><image><image>", 1: "<image>1<image><image>", 2: "<image>12<image><image>"},
            PromptReplacement: {0: "<image><image><image>", 1: "1<image><image>", 2: "12<image>"},
        },
    ),
    (
        "<image><image><image>",
        {"pattern_1": PromptIndexTargets.prefix("<image>")},
        {"pattern_1": lambda idx: str(idx + 1)},
        {
            PromptInsertion: {0: "<image><image><image>", 1: "<image>1<image><image>", 2: "<image>12<image><image>"},
            PromptReplacement: {0: "<image><image><image>", 1: "<image>1<image><image>", 2: "<image>12<image><image>"},
        },
    ),
]


@pytest.mark.parametrize(("prompt", "target_by_key", "content_by_key", "expected_by_type"), TEXT_CASES)
def test_apply_text_matches(prompt, target_by_key, content_by_key, expected_by_type):
    for update_type, expected_by_count in expected_by_type.items():
        for count, expected in expected_by_count.items():
            mm = updates(update_type, target_by_key, content_by_key, count)
            result, _ = apply_text_matches(prompt, mm)
            assert result == expected, (update_type.__name__, count)


TOKEN_CASES = [
    (
        [1, 9833, 28747, 32000, 9833, 28747, 32000, 32000, 918],
        {"pattern_1": [32000], "pattern_2": [9833, 28747], "pattern_3": [918]},
        {"pattern_1": [32000, 32000], "pattern_2": [], "pattern_3": [1550, 918, 1550]},
        {
            PromptInsertion: {
                0: [1, 9833, 28747, 32000, 9833, 28747, 32000, 32000, 918],
                1: [1, 9833, 28747, 32000, 32000, 32000, 9833, 28747, 32000, 32000, 918, 1550, 918, 1550],
                2: [1, 9833, 28747, 32000, 32000, 32000, 32000, 32000, 9833, 28747, 32000, 32000, 918,
                    1550, 918, 1550, 1550, 918, 1550],
            },
            PromptReplacement: {
                0: [1, 9833, 28747, 32000, 9833, 28747, 32000, 32000, 918],
                1: [1, 32000, 32000, 9833, 28747, 32000, 32000, 1550, 918, 1550],
                2: [1, 32000, 32000, 32000, 32000, 32000, 1550, 918, 1550],
            },
        },
    ),
    (
        [],
        {
            "pattern_1": PromptIndexTargets.start(),
            "pattern_2": PromptIndexTargets.prefix([32000]),
            "pattern_3": PromptIndexTargets.end(),
        },
        {"pattern_1": [-1], "pattern_2": [-2], "pattern_3": [-3]},
        {
            PromptInsertion: {0: [], 1: [-1, -3], 2: [-1, -1, -3, -3]},
            PromptReplacement: {0: [], 1: [-1, -3], 2: [-1, -1, -3, -3]},
        },
    ),
    (
        [32000],
        {
            "pattern_1": PromptIndexTargets.start(),
            "pattern_2": PromptIndexTargets.prefix([32000]),
            "pattern_3": PromptIndexTargets.end(),
        },
        {"pattern_1": [-1], "pattern_2": [-2], "pattern_3": [-3]},
        {
            PromptInsertion: {0: [32000], 1: [-1, 32000, -2, -3], 2: [-1, -1, 32000, -2, -2, -3, -3]},
            PromptReplacement: {0: [32000], 1: [-1, 32000, -2, -3], 2: [-1, -1, 32000, -2, -2, -3, -3]},
        },
    ),
    (
        [32000, 32000, 32000],
        {"pattern_1": [32000]},
        {"pattern_1": lambda idx: [-(idx + 1)]},
        {
            PromptInsertion: {0: [32000, 32000, 32000], 1: [32000, -1, 32000, 32000], 2: [32000, -1, -2, 32000, 32000]},
            PromptReplacement: {0: [32000, 32000, 32000], 1: [-1, 32000, 32000], 2: [-1, -2, 32000]},
        },
    ),
    (
        [32000, 32000, 32000],
        {"pattern_1": PromptIndexTargets.prefix([32000])},
        {"pattern_1": lambda idx: [-(idx + 1)]},
        {
            PromptInsertion: {0: [32000, 32000, 32000], 1: [32000, -1, 32000, 32000], 2: [32000, -1, -2, 32000, 32000]},
            PromptReplacement: {
                0: [32000, 32000, 32000], 1: [32000, -1, 32000, 32000], 2: [32000, -1, -2, 32000, 32000],
            },
        },
    ),
]


@pytest.mark.parametrize(("prompt", "target_by_key", "content_by_key", "expected_by_type"), TOKEN_CASES)
def test_apply_token_matches(prompt, target_by_key, content_by_key, expected_by_type):
    for update_type, expected_by_count in expected_by_type.items():
        for count, expected in expected_by_count.items():
            mm = updates(update_type, target_by_key, content_by_key, count)
            before = list(prompt)
            new_ids, placeholders, _ = apply_token_matches(prompt, mm)
            assert new_ids == expected, (update_type.__name__, count)
            assert prompt == before
            # every recorded placeholder points at its own tokens in the output
            for found in placeholders.values():
                for ph in found:
                    assert new_ids[ph.start_idx : ph.start_idx + ph.length] == ph.tokens


def test_apply_token_matches_with_placeholders_replace():
    prompt, targets, contents, _ = TOKEN_CASES[0]
    new_ids, placeholders, result = apply_token_matches(prompt, updates(PromptReplacement, targets, contents, 2))
    assert new_ids == [1, 32000, 32000, 32000, 32000, 32000, 1550, 918, 1550]
    assert placeholders == {
        "pattern_1": [
            PH("pattern_1", 0, 1, [32000, 32000], None),
            PH("pattern_1", 1, 3, [32000, 32000], None),
        ],
        # pattern_2's content is empty: matched, but no placeholder
        "pattern_3": [PH("pattern_3", 0, 6, [1550, 918, 1550], None)],
    }
    assert result == {"pattern_1": [0, 0], "pattern_2": [0, 0], "pattern_3": [0, None]}


def test_apply_token_matches_with_placeholders_insert():
    prompt, targets, contents, _ = TOKEN_CASES[0]
    new_ids, placeholders, result = apply_token_matches(prompt, updates(PromptInsertion, targets, contents, 2))
    assert new_ids[:8] == [1, 9833, 28747, 32000, 32000, 32000, 32000, 32000]
    assert placeholders == {
        "pattern_1": [
            PH("pattern_1", 0, 4, [32000, 32000], None),
            PH("pattern_1", 1, 6, [32000, 32000], None),
        ],
        "pattern_3": [
            PH("pattern_3", 0, 13, [1550, 918, 1550], None),
            PH("pattern_3", 1, 16, [1550, 918, 1550], None),
        ],
    }
    assert result == {"pattern_1": [0, 0], "pattern_2": [0, 0], "pattern_3": [0, 0]}


def test_apply_token_matches_index_targets_on_empty_prompt():
    mm = updates(
        PromptInsertion,
        {"a": PromptIndexTargets.start(), "b": PromptIndexTargets.prefix([7]), "c": PromptIndexTargets.end()},
        {"a": [-1], "b": [-2], "c": [-3]},
        1,
    )
    new_ids, placeholders, result = apply_token_matches([], mm)
    assert new_ids == [-1, -3]
    assert placeholders == {"a": [PH("a", 0, 0, [-1], None)], "c": [PH("c", 0, 1, [-3], None)]}
    assert result == {"a": [0], "b": [None], "c": [0]}


def test_placeholder_masks_are_evaluated():
    content = PromptUpdateDetails.select_token_id([108, 9, 9, 9, 108], 9)
    mm = {"image": [[PromptReplacement("image", [5], content).resolve(0)]]}
    new_ids, placeholders = apply_prompt_updates([1, 5, 2], mm, None)
    assert new_ids == [1, 108, 9, 9, 9, 108, 2]
    assert placeholders == {"image": [PH("image", 0, 1, [108, 9, 9, 9, 108], torch.tensor([False, True, True, True, False]))]}
    assert placeholders["image"][0].to_range().get_num_embeds() == 3


# --- planning rules ---------------------------------------------------------------------------


def test_shared_target_replace_goes_in_modality_then_item_order():
    mm = {
        "image": [[PromptReplacement("image", [32000], [-1]).resolve(0)], [PromptReplacement("image", [32000], [-2]).resolve(1)]],
        "video": [[PromptReplacement("video", [32000], [-3]).resolve(0)]],
    }
    new_ids, placeholders = apply_prompt_updates([1, 32000, 5, 32000, 32000], mm, None)
    assert new_ids == [1, -1, 5, -2, -3]
    assert placeholders == {
        "image": [PH("image", 0, 1, [-1], None), PH("image", 1, 3, [-2], None)],
        "video": [PH("video", 0, 4, [-3], None)],
    }
    reordered = {"video": mm["video"], "image": mm["image"]}
    assert apply_prompt_updates([1, 32000, 5, 32000, 32000], reordered, None)[0] == [1, -3, 5, -1, -2]


def test_shared_target_insert_puts_every_item_at_the_first_match():
    mm = {
        "image": [[PromptInsertion("image", [1], [-1]).resolve(i)] for i in range(2)],
        "video": [[PromptInsertion("video", [1], [-3]).resolve(0)]],
    }
    new_ids, placeholders = apply_prompt_updates([1, 2, 1], mm, None)
    assert new_ids == [1, -1, -1, -3, 2, 1]
    assert [p.start_idx for p in placeholders["image"]] == [1, 2]
    assert [p.start_idx for p in placeholders["video"]] == [3]


def test_round_mode_comes_from_the_highest_priority_item():
    # The image INSERT (priority 0) fixes the first round's mode, so the audio REPLACE waits and
    # then only finds the second `7` (vLLM 0.33 behaves the same).
    mm = {
        "image": [[PromptInsertion("image", [5], [-1]).resolve(0)]],
        "audio": [[PromptReplacement("audio", [7], [-2]).resolve(0)]],
    }
    new_ids, placeholders = apply_prompt_updates([1, 7, 5, 7], mm, None)
    assert new_ids == [1, 7, 5, -1, -2]
    assert placeholders == {"image": [PH("image", 0, 3, [-1], None)], "audio": [PH("audio", 0, 4, [-2], None)]}


def test_same_position_shorter_match_wins():
    # Matches sort as (start, end, priority), so at one position the shorter target goes first.
    mm = {
        "image": [[PromptReplacement("image", [5, 6], [-1]).resolve(0)]],
        "audio": [[PromptReplacement("audio", [5], [-2]).resolve(0)]],
    }
    new_ids, _, result = apply_token_matches([5, 6, 5, 6], mm)
    assert new_ids == [-2, 6, -1]
    assert result == {"image": [0], "audio": [0]}


def test_first_matching_alternative_is_used():
    alternatives = [
        PromptReplacement("image", [99], [-9]).resolve(0),
        PromptReplacement("image", [5], [-5]).resolve(0),
    ]
    new_ids, placeholders, result = apply_token_matches([1, 5], {"image": [alternatives]})
    assert new_ids == [1, -5]
    assert result == {"image": [1]}
    assert placeholders == {"image": [PH("image", 0, 1, [-5], None)]}


def test_items_with_different_targets_are_reported_in_item_order():
    upd = PromptReplacement("image", lambda i: [10 + i], lambda i: [-(i + 1)])
    mm = {"image": [[upd.resolve(0)], [upd.resolve(1)]]}
    new_ids, placeholders = apply_prompt_updates([11, 0, 10], mm, None)
    assert new_ids == [-2, 0, -1]
    assert placeholders == {"image": [PH("image", 0, 2, [-1], None), PH("image", 1, 0, [-2], None)]}


def test_start_target_after_a_replace_round_lands_at_the_current_position():
    mm = {
        "image": [[PromptReplacement("image", [5], [-1]).resolve(0)]],
        "audio": [[PromptInsertion("audio", PromptIndexTargets.start(), [-2]).resolve(0)]],
    }
    new_ids, placeholders = apply_prompt_updates([5, 6], mm, None)
    assert new_ids == [-1, -2, 6]
    assert placeholders == {"image": [PH("image", 0, 0, [-1], None)], "audio": [PH("audio", 0, 1, [-2], None)]}


def test_no_updates_returns_a_copy_of_the_prompt():
    prompt = [1, 2, 3]
    new_ids, placeholders = apply_prompt_updates(prompt, {"image": []}, None)
    assert new_ids == prompt and new_ids is not prompt and placeholders == {}


def test_many_items_with_one_target_each_take_successive_occurrences():
    n = 50
    prompt = [0] + [32000, 7] * n
    upd = PromptReplacement("image", [32000], lambda i: [-i - 1, -i - 1])
    new_ids, placeholders = apply_prompt_updates(prompt, {"image": [[upd.resolve(i)] for i in range(n)]}, None)
    assert [p.start_idx for p in placeholders["image"]] == [1 + 3 * i for i in range(n)]
    assert new_ids[1:4] == [-1, -1, 7]


# --- errors -----------------------------------------------------------------------------------


def test_fewer_placeholders_than_items_is_a_typed_error(tok):
    boi = tok.convert_tokens_to_ids("<start_of_image>")
    prompt = tok.encode("Compare <start_of_image> and")
    upd = PromptReplacement("image", [boi], [boi, 7, 7])
    mm = {"image": [[upd.resolve(0)], [upd.resolve(1)]]}
    with pytest.raises(PromptUpdateError) as info:
        apply_prompt_updates(prompt, mm, tok)
    err = info.value
    assert (err.modality, err.expected, err.found) == ("image", 2, 1)
    assert str(err) == (
        "Expected 2 placeholder(s) for image items but found 1 in the prompt. Put one `<start_of_image>` "
        "(the model's image placeholder) in the prompt for each image."
    )
    assert isinstance(err, ValueError)


def test_fewer_placeholders_without_tokenizer_names_the_ids():
    upd = PromptReplacement("audio", [42], [-1])
    mm = {"image": [], "audio": [[upd.resolve(0)], [upd.resolve(1)], [upd.resolve(2)]]}
    with pytest.raises(PromptUpdateError, match=r"Expected 3 placeholder\(s\) for audio items but found 0") as info:
        apply_prompt_updates([1, 2], mm, None)
    assert "`[42]`" in str(info.value)
    assert (info.value.expected, info.value.found) == (3, 0)


def test_missing_insert_anchor_says_where_the_model_inserts(tok):
    upd = PromptInsertion("image", "<start_of_turn>", [7])
    with pytest.raises(PromptUpdateError, match="inserts its image tokens after `<start_of_turn>`"):
        apply_prompt_updates(tok.encode("hello"), {"image": [[upd.resolve(0)]]}, tok)


def test_missing_index_anchor_is_reported():
    upd = PromptInsertion("image", PromptIndexTargets.prefix([1, 2]), [7])
    with pytest.raises(PromptUpdateError, match="anchored to") as info:
        apply_prompt_updates([3], {"image": [[upd.resolve(0)]]}, None)
    assert info.value.found == 0


def test_item_without_updates_is_reported_as_a_model_bug():
    with pytest.raises(PromptUpdateError, match="defined no prompt update"):
        apply_prompt_updates([1], {"image": [[]]}, None)


def test_extra_placeholders_stay_in_the_prompt(tok):
    boi = tok.convert_tokens_to_ids("<start_of_image>")
    prompt = [boi, 1, boi, 2, boi]
    upd = PromptReplacement("image", [boi], [-1, -1])
    new_ids, placeholders = apply_prompt_updates(prompt, {"image": [[upd.resolve(0)], [upd.resolve(1)]]}, tok)
    assert new_ids == [-1, -1, 1, -1, -1, 2, boi]
    assert [p.start_idx for p in placeholders["image"]] == [0, 3]


# --- text-level fallback with a real byte-level BPE tokenizer ---------------------------------


def _contains(ids: list[int], sub: list[int]) -> bool:
    return any(ids[i : i + len(sub)] == sub for i in range(len(ids) - len(sub) + 1))


def test_foo_inside_food_is_replaced(tok):
    img = tok.convert_tokens_to_ids("<image_soft_token>")
    prompt = tok.encode("I like food")
    upd = PromptReplacement("image", "foo", [img, img])
    new_ids, placeholders = apply_prompt_updates(prompt, {"image": [[upd.resolve(0)]]}, tok)
    assert new_ids == tok.encode("<bos>I like <image_soft_token><image_soft_token>d", add_special_tokens=False)
    start = new_ids.index(img)
    assert placeholders == {"image": [PH("image", 0, start, [img, img], None)]}


def test_text_fallback_places_a_target_that_tokenizes_differently(tok):
    img = tok.convert_tokens_to_ids("<image_soft_token>")
    prompt = tok.encode("Describe this image")
    # precondition: "is" is a token, but inside "this" it is not
    assert not _contains(prompt, tok.encode("is", add_special_tokens=False))
    upd = PromptReplacement("image", "is", PromptUpdateDetails.select_token_id([img, img, img], img))
    new_ids, placeholders = apply_prompt_updates(prompt, {"image": [[upd.resolve(0)]]}, tok)
    head = tok.encode("<bos>Describe th", add_special_tokens=False)
    assert new_ids == [*head, img, img, img, *tok.encode(" image", add_special_tokens=False)]
    assert placeholders == {"image": [PH("image", 0, len(head), [img, img, img], torch.tensor([True, True, True]))]}


def test_text_fallback_resolves_prefix_targets_in_text_space(tok):
    img, sot = tok.convert_tokens_to_ids(["<image_soft_token>", "<start_of_turn>"])
    prompt = tok.encode("Describe this")
    mm = {
        "image": [[PromptInsertion("image", PromptIndexTargets.prefix("<bos>"), [img, img]).resolve(0)]],
        "audio": [[PromptReplacement("audio", "is", [sot]).resolve(0)]],
    }
    new_ids, placeholders = apply_prompt_updates(prompt, mm, tok)
    assert new_ids == tok.encode(
        "<bos><image_soft_token><image_soft_token>Describe th<start_of_turn>", add_special_tokens=False
    )
    assert placeholders == {
        "image": [PH("image", 0, 1, [img, img], None)],
        "audio": [PH("audio", 0, new_ids.index(sot), [sot], None)],
    }


def test_text_fallback_resolves_end_targets_in_text_space(tok):
    eoi, sot = tok.convert_tokens_to_ids(["<end_of_image>", "<start_of_turn>"])
    prompt = tok.encode("Describe this image")
    mm = {
        "audio": [[PromptReplacement("audio", "is", [sot]).resolve(0)]],
        "video": [[PromptInsertion("video", PromptIndexTargets.end(), "<end_of_image>").resolve(0)]],
    }
    new_ids, placeholders = apply_prompt_updates(prompt, mm, tok)
    assert new_ids == tok.encode("<bos>Describe th<start_of_turn> image<end_of_image>", add_special_tokens=False)
    assert placeholders["video"] == [PH("video", 0, len(new_ids) - 1, [eoi], None)]


def test_text_fallback_that_cannot_place_an_item_counts_what_it_found(tok):
    boi = tok.convert_tokens_to_ids("<start_of_image>")
    prompt = tok.encode("Describe this")
    assert not _contains(prompt, tok.encode("is", add_special_tokens=False))
    upd = PromptReplacement("image", "is", [boi])
    mm = {"image": [[upd.resolve(0)], [upd.resolve(1)]]}
    with pytest.raises(PromptUpdateError) as info:
        apply_prompt_updates(prompt, mm, tok)
    assert (info.value.expected, info.value.found) == (2, 1)
    assert "Put one `is`" in str(info.value)


def test_text_fallback_reports_contents_merged_by_retokenization(tok):
    nl = tok.encode("\n", add_special_tokens=False)
    prompt = tok.encode("this\n")
    assert not _contains(prompt, tok.encode("is", add_special_tokens=False))
    assert len(tok.encode("\n\n", add_special_tokens=False)) == 1  # "\n\n" is one token
    upd = PromptReplacement("image", "is", nl)
    with pytest.raises(PromptUpdateError, match="after re-tokenizing") as info:
        apply_prompt_updates(prompt, {"image": [[upd.resolve(0)]]}, tok)
    assert (info.value.expected, info.value.found) == (1, 0)


# --- find_mm_placeholders ---------------------------------------------------------------------

FIND_CONTENTS = {
    "pattern_1": [32000, 32000],
    "pattern_2": [],
    "pattern_3": [1550, 918, 1550],
    "pattern_4": [32000],  # shares its token with pattern_1: modality order decides
}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (
            [1, 9833, 28747, 32000, 9833, 28747, 32000, 32000, 918],
            {
                "pattern_1": [PH("pattern_1", 0, 6, [32000, 32000], None)],
                "pattern_4": [PH("pattern_4", 0, 3, [32000], None)],
            },
        ),
        (
            [1, 32000, 32000, 9833, 28747, 32000, 32000, 1550, 918, 1550],
            {
                "pattern_1": [PH("pattern_1", 0, 1, [32000, 32000], None), PH("pattern_1", 1, 5, [32000, 32000], None)],
                "pattern_3": [PH("pattern_3", 0, 7, [1550, 918, 1550], None)],
                # no pattern_4: pattern_1 comes first at every 32000
            },
        ),
        (
            [1, 32000, 32000, 32000, 32000, 32000, 1550, 918, 1550],
            {
                "pattern_1": [PH("pattern_1", 0, 1, [32000, 32000], None), PH("pattern_1", 1, 3, [32000, 32000], None)],
                "pattern_4": [PH("pattern_4", 0, 5, [32000], None)],
                "pattern_3": [PH("pattern_3", 0, 6, [1550, 918, 1550], None)],
            },
        ),
    ],
)
@pytest.mark.parametrize("update_type", [PromptInsertion, PromptReplacement])
def test_find_mm_placeholders(prompt, expected, update_type):
    mm = {key: [[update_type(key, [], content).resolve(i)] for i in range(3)] for key, content in FIND_CONTENTS.items()}
    assert find_mm_placeholders(prompt, mm) == expected


def test_find_mm_placeholders_missing_item_stops_its_modality():
    upd = PromptReplacement("image", [0], lambda i: [-(i + 1)])
    mm = {"image": [[upd.resolve(0)], [upd.resolve(1)]]}
    assert find_mm_placeholders([5, -2, 5], mm) == {}
    assert find_mm_placeholders([-1, 5, -2], mm) == {
        "image": [PH("image", 0, 0, [-1], None), PH("image", 1, 2, [-2], None)]
    }


def test_find_mm_placeholders_skips_empty_contents_and_uses_alternatives(tok):
    img = tok.convert_tokens_to_ids("<image_soft_token>")
    mm = {
        "image": [
            [PromptReplacement("image", [0], []).resolve(0)],
            [
                PromptReplacement("image", [0], [-9, -9]).resolve(1),
                PromptReplacement("image", [0], PromptUpdateDetails.select_token_id("<image_soft_token>x", img)).resolve(1),
            ],
        ]
    }
    found = find_mm_placeholders([3, img, ord("x"), 4, -9, -9], mm, tok)
    assert found == {"image": [PH("image", 1, 1, [img, ord("x")], torch.tensor([True, False]))]}


def test_find_mm_placeholders_adversarial_prefixes():
    content = [7] * 20 + [8]
    prompt = [7] * 500 + [8] + [7] * 30
    mm = {"image": [[PromptReplacement("image", [0], content).resolve(0)]]}
    assert find_mm_placeholders(prompt, mm) == {"image": [PH("image", 0, 480, content, None)]}


# --- properties -------------------------------------------------------------------------------

ALPHABET = st.integers(min_value=0, max_value=4)


@st.composite
def prompts_and_updates(draw, mode=None):
    """A prompt over a 5-token alphabet and 1-3 modalities with one token target each.

    Modality k's contents use ids in [-10k-9, -10k-1], so contents of different modalities never
    share a token and never contain a target.
    """
    prompt = draw(st.lists(ALPHABET, max_size=30))
    n_modalities = draw(st.integers(1, 3))
    mm = {}
    spec = []
    for k in range(n_modalities):
        target = draw(st.lists(ALPHABET, min_size=1, max_size=3))
        update_mode = mode or draw(st.sampled_from([PromptInsertion, PromptReplacement]))
        contents = draw(st.lists(st.lists(st.integers(-10 * k - 9, -10 * k - 1), max_size=4), max_size=3))
        update = update_mode(f"m{k}", target, lambda i, contents=contents: contents[i])
        mm[f"m{k}"] = [[update.resolve(i)] for i in range(len(contents))]
        spec.append((target, contents))
    return prompt, mm, spec


@settings(max_examples=300, deadline=None)
@given(prompts_and_updates())
def test_property_find_recovers_the_applied_placeholders(case):
    prompt, mm, _ = case
    new_ids, placeholders, result = apply_token_matches(prompt, mm)
    placed = {modality: [items[i] for i, alt in enumerate(result[modality]) if alt is not None] for modality, items in mm.items()}
    assert find_mm_placeholders(new_ids, placed) == placeholders
    for found in placeholders.values():
        for ph in found:
            assert new_ids[ph.start_idx : ph.start_idx + ph.length] == ph.tokens


def naive_replace(prompt, spec):
    """Left to right; at each position the shortest target that matches (then modality order)
    takes its next item."""
    out, i, next_item = [], 0, [0] * len(spec)
    while i < len(prompt):
        hits = [
            (len(target), k)
            for k, (target, contents) in enumerate(spec)
            if next_item[k] < len(contents) and prompt[i : i + len(target)] == target
        ]
        if hits:
            length, k = min(hits)
            out += spec[k][1][next_item[k]]
            next_item[k] += 1
            i += length
        else:
            out.append(prompt[i])
            i += 1
    return out


def naive_insert(prompt, spec):
    """Every item of a modality goes right after the first occurrence of its target; matches are
    taken in (start, end, modality) order and never re-emit prompt tokens."""
    inserts = []
    for k, (target, contents) in enumerate(spec):
        starts = [i for i in range(len(prompt) - len(target) + 1) if prompt[i : i + len(target)] == target]
        if starts and contents:
            inserts.append((starts[0], starts[0] + len(target), k, [t for c in contents for t in c]))
    out, pos = [], 0
    for _, end, _, tokens in sorted(inserts):
        if end > pos:
            out += prompt[pos:end]
            pos = end
        out += tokens
    return out + prompt[pos:]


@settings(max_examples=300, deadline=None)
@given(prompts_and_updates(mode=PromptReplacement))
def test_property_replace_matches_naive_reference(case):
    prompt, mm, spec = case
    assert apply_token_matches(prompt, mm)[0] == naive_replace(prompt, spec)


@settings(max_examples=300, deadline=None)
@given(prompts_and_updates(mode=PromptInsertion))
def test_property_insert_matches_naive_reference(case):
    prompt, mm, spec = case
    assert apply_token_matches(prompt, mm)[0] == naive_insert(prompt, spec)


@settings(max_examples=300, deadline=None)
@given(st.lists(ALPHABET, max_size=40), st.lists(ALPHABET, min_size=1, max_size=4), st.integers(0, 45))
def test_property_iter_token_matches(token_ids, match_ids, start_idx):
    matches = list(iter_token_matches(token_ids, match_ids, start_idx=start_idx))
    prev_end = start_idx
    for start, end in matches:
        assert start >= prev_end  # increasing and non-overlapping
        assert token_ids[start:end] == match_ids
        prev_end = end
    # greedy leftmost scan gives the same matches
    expected, i = [], start_idx
    while i + len(match_ids) <= len(token_ids):
        if token_ids[i : i + len(match_ids)] == match_ids:
            expected.append((i, i + len(match_ids)))
            i += len(match_ids)
        else:
            i += 1
    assert matches == expected
