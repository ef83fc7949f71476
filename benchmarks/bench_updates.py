"""Prompt updates: vLLM's performance guards and the Gemma3 cache-hit splice.

vLLM 0.33's guards (tests/multimodal/test_processing.py): a 10k-token prompt with no match under
0.1 s, 1k vs 4k items scaling linearly (under 8x), an adversarial 30k-token placeholder scan under
0.5 s. vLLM's ``apply_prompt_updates`` costs 0.24-0.33 ms for the Gemma3 case (275-token result,
one 260-token replacement with a ``select_token_id`` mask); mmfront aims at 20-40 us there.
Baselines come from the same run: a bare list splice/copy of the same sizes.
"""

from __future__ import annotations

from _harness import Report, median_time
from mmfront.errors import PromptUpdateError
from mmfront.fixtures.models.gemma3 import make_gemma3_tokenizer
from mmfront.processing._placeholders import find_mm_placeholders
from mmfront.processing._splicing import apply_prompt_updates, apply_token_matches
from mmfront.processing.updates import PromptReplacement, PromptUpdateDetails

GROUP = "updates"
BOI, IMG, EOI, NL2 = 255999, 262144, 256000, 108


def _gemma3_case() -> tuple[list[int], list[int], PromptReplacement]:
    prompt = [2, 105, 2364, 107, BOI, *range(300, 310), 106, 107, 105, 4368, 107]
    content = [NL2, BOI] + [IMG] * 256 + [EOI, NL2]
    update = PromptReplacement("image", [BOI], PromptUpdateDetails.select_token_id(content, IMG))
    return prompt, content, update


def _bench_gemma3(report: Report, repeat: int) -> None:
    prompt, content, update = _gemma3_case()
    hit_updates = {"image": [[update.resolve(0)]]}  # what a cache hit reuses
    new_ids, _ = apply_prompt_updates(prompt, hit_updates, None)
    assert len(new_ids) == len(prompt) - 1 + len(content)

    def miss() -> object:  # freshly resolved update: the mask is built too
        fresh = PromptReplacement("image", [BOI], PromptUpdateDetails.select_token_id(content, IMG))
        return apply_prompt_updates(prompt, {"image": [[fresh.resolve(0)]]}, None)

    s = prompt.index(BOI)
    t_hit = median_time(lambda: apply_prompt_updates(prompt, hit_updates, None), repeat=repeat)
    t_miss = median_time(miss, repeat=repeat)
    t_splice = median_time(lambda: prompt[:s] + content + prompt[s + 1 :], repeat=repeat)
    t_find = median_time(lambda: find_mm_placeholders(new_ids, hit_updates, None), repeat=repeat)
    report.add(GROUP, f"gemma3 apply, cached update ({len(new_ids)} tok, 1 item)", t_hit * 1e6, "us",
               target="<= 40 us", ok=t_hit <= 40e-6)
    report.add(GROUP, "gemma3 apply, fresh update (+resolve, +mask)", t_miss * 1e6, "us")
    report.add(GROUP, "gemma3 find_mm_placeholders", t_find * 1e6, "us")
    report.add(GROUP, "baseline: bare list splice of the same sizes", t_splice * 1e6, "us")
    report.ratio(GROUP, "gemma3 apply (cached) / bare splice", t_hit / t_splice, at_most=25)
    report.ratio(GROUP, "vLLM 0.33 apply (0.24 ms, reference doc) / mmfront", 240e-6 / t_hit, at_least=6)


def _bench_no_match(report: Report, repeat: int) -> None:
    tok = make_gemma3_tokenizer()
    prompt = [(i * 7919) % 400 + 1 for i in range(10_000)]
    update = PromptReplacement("image", [BOI], [IMG] * 4)
    mm = {"image": [[update.resolve(0)]]}
    t_token = median_time(lambda: apply_token_matches(prompt, mm), repeat=repeat)

    def failing() -> None:
        try:
            apply_prompt_updates(prompt, mm, tok)
        except PromptUpdateError:
            return
        raise AssertionError("expected a PromptUpdateError")

    t_error = median_time(failing, repeat=max(3, repeat // 3))
    t_copy = median_time(lambda: list(prompt), repeat=repeat)
    report.add(GROUP, "10k tokens, no match: token path", t_token * 1e3, "ms", target="< 100 ms", ok=t_token < 0.1)
    report.add(GROUP, "10k tokens, no match: full apply incl. text fallback", t_error * 1e3, "ms",
               target="< 100 ms", ok=t_error < 0.1)
    report.ratio(GROUP, "10k no-match token path / list copy", t_token / t_copy)


def _many_items(n: int) -> tuple[list[int], dict]:
    prompt: list[int] = [2]
    for i in range(n):
        prompt += [300 + i % 50, 301, 302, BOI, 107]
    prompt += [1000]
    image = PromptReplacement("image", [BOI], lambda i: [NL2, BOI] + [IMG] * 16 + [EOI, NL2])
    audio = PromptReplacement("audio", [1000], [7, 7])  # one far-away target: must not rescan per round
    return prompt, {"image": [[image.resolve(i)] for i in range(n)], "audio": [[audio.resolve(0)]]}


def _bench_scaling(report: Report, repeat: int) -> None:
    p1, mm1 = _many_items(1000)
    p4, mm4 = _many_items(4000)
    t1 = median_time(lambda: apply_prompt_updates(p1, mm1, None), repeat=repeat)
    t4 = median_time(lambda: apply_prompt_updates(p4, mm4, None), repeat=repeat)
    c1 = median_time(lambda: list(p1), repeat=repeat)
    report.add(GROUP, "1k items apply", t1 * 1e3, "ms")
    report.add(GROUP, "4k items apply", t4 * 1e3, "ms")
    report.ratio(GROUP, "4k / 1k items (linear = 4)", t4 / t1, at_most=8)
    report.ratio(GROUP, "1k items apply / list copy of the prompt", t1 / c1)


def _bench_adversarial(report: Report, repeat: int) -> None:
    prompt = [7] * 30_000
    near_miss = [7] * 16 + [8]  # every position starts a candidate that fails at its end
    near_miss_mid = [7] * 8 + [9] + [7] * 8  # fails in the middle
    mm = {
        "image": [[PromptReplacement("image", [0], near_miss).resolve(i)] for i in range(4)],
        "video": [[PromptReplacement("video", [0], near_miss_mid).resolve(i)] for i in range(4)],
        "audio": [[PromptReplacement("audio", [0], [7] * 100).resolve(i)] for i in range(100)],
    }
    t_find = median_time(lambda: find_mm_placeholders(prompt, mm), repeat=repeat)
    target_mm = {"image": [[PromptReplacement("image", near_miss_mid, [1]).resolve(0)]]}
    t_match = median_time(lambda: apply_token_matches(prompt, target_mm), repeat=repeat)
    t_copy = median_time(lambda: list(prompt), repeat=repeat)
    report.add(GROUP, "adversarial 30k-token placeholder scan", t_find * 1e3, "ms", target="< 500 ms",
               ok=t_find < 0.5)
    report.add(GROUP, "adversarial 30k-token target match (no hit)", t_match * 1e3, "ms", target="< 500 ms",
               ok=t_match < 0.5)
    report.ratio(GROUP, "adversarial scan / list copy", t_find / t_copy)


def run(report: Report, quick: bool) -> None:
    repeat = 5 if quick else 15
    _bench_gemma3(report, repeat)
    _bench_no_match(report, repeat)
    _bench_scaling(report, repeat)
    _bench_adversarial(report, repeat)
