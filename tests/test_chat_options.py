"""Issue 9.4: chat options reach every entry point; a folder without a template (GLM-ASR before
its fixture shipped the real one) has a way in. (Request templates' trust and bounds, issue 13.8,
are in tests/hardening/test_chat_template_limits.py.)"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.chat import parse_chat_messages
from mmfront.engine.client import EngineClient
from mmfront.engine.transports import BaseTransport
from mmfront.errors import ChatFormatError, ValidationError
from mmfront.fixtures.models.glmasr import GLMASR_CHAT_TEMPLATE
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import make_audio, wav_bytes
from mmfront.wire.messages import Direction, decode_message

# GLM-ASR's native inputs are not proven equal to vLLM's (refused for --model-impl auto): its transformers layout
GLMASR_IMPL = "transformers"

TEMPLATE = ("{% if tools %}[tools:{{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
            "{% if flavor is defined %}[{{ flavor }}]{% endif %}"
            "{% for m in messages %}<{{ m['role'] }}>{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}<model>{% endif %}")
MESSAGES = [{"role": "user", "content": "Hi"}]
OPTIONS: dict[str, Any] = {"chat_template": TEMPLATE, "chat_template_kwargs": {"flavor": "salty"},
                           "tools": [{"type": "function", "function": {"name": "lookup"}}],
                           "add_generation_prompt": False}
RENDERED = "[tools:lookup][salty]<user>Hi"


class Recorder(BaseTransport):
    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send(self, frames: Sequence[Any]) -> None:
        self.sent.append(list(frames))

    def recv(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None


@pytest.fixture
def pre(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig(trust_request_chat_template=True))


def ids(pre: InputPreprocessor, text: str) -> list[int]:
    return list(pre.tokenizer.encode(text, add_special_tokens=False))


def test_preprocess_takes_every_chat_option(pre: InputPreprocessor) -> None:
    assert pre.preprocess(MESSAGES, **OPTIONS)["prompt_token_ids"] == ids(pre, RENDERED)


def test_process_inputs_takes_every_chat_option(pre: InputPreprocessor) -> None:
    request = InputProcessor(pre).process_inputs("r1", MESSAGES, **OPTIONS)
    assert request.prompt_token_ids == ids(pre, RENDERED)


def test_client_takes_every_chat_option(pre: InputPreprocessor) -> None:
    transport = Recorder()
    EngineClient(InputProcessor(pre), transport).add_request("r1", MESSAGES, **OPTIONS)
    (frames,) = transport.sent
    request = decode_message(frames, Direction.TO_ENGINE).body
    assert request.request_id == "r1" and request.prompt_token_ids == ids(pre, RENDERED)


def test_generation_flags_with_the_model_template(pre: InputPreprocessor) -> None:
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]
    closed = pre.preprocess(messages, add_generation_prompt=False)["prompt"]
    assert closed.endswith("<start_of_turn>model\nThe answer is<end_of_turn>\n")
    continued = pre.preprocess(messages, add_generation_prompt=False, continue_final_message=True)["prompt"]
    assert continued == "<bos><start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\nThe answer is"
    with pytest.raises(ChatFormatError, match="Cannot set both `continue_final_message` and `add_generation_prompt`") \
            as e:
        pre.preprocess(messages, continue_final_message=True)
    assert e.value.parameter == "continue_final_message"
    # vLLM's precedence: chat_template_kwargs may set the flags too, and win.
    via_kwargs = pre.preprocess(messages, chat_template_kwargs={"add_generation_prompt": False,
                                                                "continue_final_message": True})
    assert via_kwargs["prompt"] == continued


@pytest.mark.parametrize(("options", "parameter", "match"), [
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", r"may not set \['tokenize'\]"),
    ({"chat_template_kwargs": ["flavor"]}, "chat_template_kwargs", "object with string keys"),
    ({"tools": "lookup"}, "tools", "list of tool objects"),
    ({"chat_template": TEMPLATE + "{{ raise_exception('no tools given') }}"}, "messages", "no tools given"),
])
def test_bad_chat_options(pre: InputPreprocessor, options: dict[str, Any], parameter: str, match: str) -> None:
    with pytest.raises(ChatFormatError, match=match) as e:
        pre.preprocess(MESSAGES, **options)
    assert e.value.parameter == parameter


@pytest.mark.parametrize("option", [{"chat_template": TEMPLATE}, {"chat_template_kwargs": {"flavor": "x"}},
                                    {"add_generation_prompt": False}, {"continue_final_message": True},
                                    {"tools": [{"type": "function", "function": {"name": "f"}}]}])
def test_chat_options_on_a_plain_prompt_are_refused(pre: InputPreprocessor, option: dict[str, Any]) -> None:
    (name,) = option
    for prompt in ("Hi", [1, 2, 3]):
        with pytest.raises(ValidationError, match=f"`{name}` applies to chat messages only") as e:
            pre.preprocess(prompt, **option)
        assert e.value.parameter == name


def test_glmasr_folder_ships_its_real_template(glmasr_dir: Path) -> None:
    assert (glmasr_dir / "chat_template.jinja").read_text() == GLMASR_CHAT_TEMPLATE
    audio = base64.b64encode(wav_bytes(make_audio(1.0), 16000)).decode()
    proc = create_processor(glmasr_dir, MultiModalConfig(model_impl=GLMASR_IMPL))
    chat = parse_chat_messages([{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
        {"type": "text", "text": "Please transcribe this audio into text"}]}],
        proc, MediaConnector(proc.info.config), budget=DecodeBudget(1 << 30))
    assert chat.prompt == ("<|user|>\n<|begin_of_audio|><|pad|><|end_of_audio|><|user|>\n"
                           "Please transcribe this audio into text<|assistant|>\n")
    (audio_range,) = proc.apply(chat.prompt, chat.mm_data, add_special_tokens=False)["mm_placeholders"]["audio"]
    assert audio_range.get_num_embeds() == 12  # 1.0 s is 12 <|pad|> tokens


def test_folder_without_a_template_gets_one_from_the_config(glmasr_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "glmasr-bare"
    bare.mkdir()
    for item in glmasr_dir.iterdir():
        if item.name != "chat_template.jinja":
            (bare / item.name).write_bytes(item.read_bytes())
    with pytest.raises(ChatFormatError, match=r"no chat template: set MultiModalConfig\(chat_template=\.\.\.\)"):
        InputPreprocessor(bare, MultiModalConfig(model_impl=GLMASR_IMPL)).preprocess(MESSAGES)
    pre = InputPreprocessor(bare, MultiModalConfig(chat_template=GLMASR_CHAT_TEMPLATE, model_impl=GLMASR_IMPL))
    assert pre.preprocess(MESSAGES)["prompt"] == "<|user|>\nHi<|assistant|>\n"
    trusting = InputPreprocessor(bare, MultiModalConfig(trust_request_chat_template=True, model_impl=GLMASR_IMPL))
    assert trusting.preprocess(MESSAGES, chat_template=GLMASR_CHAT_TEMPLATE)["prompt"] == "<|user|>\nHi<|assistant|>\n"
