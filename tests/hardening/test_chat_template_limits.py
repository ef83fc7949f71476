"""Hardening, class 8 (part): a per-request chat template is refused unless the deployment trusts
request templates (vLLM's rule), and a trusted one is bounded in size and in rendering time."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmfront import MultiModalConfig
from mmfront import chat_template as ct
from mmfront.errors import ChatFormatError
from mmfront.preprocess import InputPreprocessor

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<model>{% endif %}"
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def pre(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig(trust_request_chat_template=True))


def test_request_template_needs_trust(gemma3_dir: Path) -> None:
    untrusted = InputPreprocessor(gemma3_dir)
    with pytest.raises(ChatFormatError, match="trust_request_chat_template is not set") as e:
        untrusted.preprocess(MESSAGES, chat_template=TEMPLATE)
    assert e.value.parameter == "chat_template"
    with pytest.raises(ChatFormatError, match=r"may not set \['chat_template'\]") as e:
        untrusted.preprocess(MESSAGES, chat_template_kwargs={"chat_template": TEMPLATE})
    assert e.value.parameter == "chat_template_kwargs"


def test_deployment_template_is_trusted(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(chat_template=TEMPLATE))
    assert pre.preprocess(MESSAGES)["prompt"] == "<user>Hi<model>"


def test_request_template_is_size_bounded(pre: InputPreprocessor) -> None:
    huge = TEMPLATE + "{# " + "x" * ct.REQUEST_TEMPLATE_MAX_CHARS + " #}"
    with pytest.raises(ChatFormatError, match=f"at most {ct.REQUEST_TEMPLATE_MAX_CHARS}") as e:
        pre.preprocess(MESSAGES, chat_template=huge)
    assert e.value.parameter == "chat_template"
    with pytest.raises(ChatFormatError, match="non-empty string"):
        pre.preprocess(MESSAGES, chat_template="  ")


def test_request_template_is_time_bounded(pre: InputPreprocessor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ct, "REQUEST_TEMPLATE_SECONDS", 0.05)
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(ChatFormatError, match=r"took longer than 0\.05 s to render") as e:
        pre.preprocess(MESSAGES, chat_template=endless)
    assert e.value.parameter == "chat_template"
    assert pre.preprocess(MESSAGES, chat_template=TEMPLATE)["prompt"] == "<user>Hi<model>"  # tracing is off again
