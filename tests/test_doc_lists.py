"""The hand-kept lists of README.md and docs/index.md cannot go stale: README's model list is
generated from the catalog (``mmfront.models.catalog``) and docs/models.md's survey summary, and
every page of docs/ is in README's doc list and in docs/index.md's page table, and nothing else is.

When a model module or the survey changes, the failing test prints the list to paste."""

from __future__ import annotations

import re
from pathlib import Path

from mmfront.models.catalog import model_specs
from mmfront.models.spec import ModelSpec

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

MODEL_LIST_BEGIN = ("<!-- model list: generated from mmfront.models.catalog and docs/models.md; "
                    "tests/test_doc_lists.py checks it -->")
MODEL_LIST_END = "<!-- end of model list -->"
SURVEY_SUMMARY = re.compile(r"^(?P<total>\d+) processors under transformers (?P<version>[\w.]+): "
                            r"(?P<served>\d+) served\b", re.MULTILINE)
DOC_LINK = re.compile(r"\]\((?:docs/)?(?P<page>[\w-]+\.md)\)")


def declarations(spec: ModelSpec) -> str:
    """What a model module declares besides its processor, in the words of the list."""
    out = [f"option `{option.name}`" for option in spec.options]
    if spec.reference is not None:
        out.append("reference encoder")
        if spec.reference.positions is not None:
            out.append("M-RoPE positions")
    out += [what for what, declared in (
        ("backend placeholders", spec.backend_placeholders), ("video metadata", spec.video_needs_metadata),
        ("prompt layout", spec.prompt_layout), ("unexpanded placeholders", spec.unexpanded_placeholders),
        ("prompt outputs", spec.prompt_outputs), ("image patches", spec.image_patches),
        ("vLLM native inputs", spec.native)) if declared]
    return ", ".join(out)


def model_list() -> str:
    """README's model list, between its markers: the survey's count from docs/models.md, then one
    row per model module the catalog finds."""
    summary = SURVEY_SUMMARY.search((DOCS / "models.md").read_text(encoding="utf-8"))
    assert summary is not None, "docs/models.md has no survey summary line (`mmfront models --write docs/models.md`)"
    lines = [
        MODEL_LIST_BEGIN,
        f"{summary['served']} of the {summary['total']} HF processors with a `replace_<modality>_token` hook are "
        f"served, proven offline against the HF processor's own output under transformers {summary['version']}; "
        "[docs/models.md](docs/models.md) says processor by processor what is served, what is refused and why. "
        "Every other processor goes through the one generic [transformers backend](docs/transformers-backend.md); "
        "these models have a module in `mmfront.models` declaring what it cannot learn from the processor:",
        "",
        "| model type | HF processor | served by | declares |",
        "|---|---|---|---|",
    ]
    for model_type, spec in sorted(model_specs().items()):
        served_by = "native processor" if spec.processor is not None else "transformers backend"
        lines.append(f"| `{model_type}` | `{spec.hf_processor_class}` | {served_by} | {declarations(spec)} |")
    return "\n".join([*lines, MODEL_LIST_END])


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a markdown text."""
    match = re.search(rf"^## {re.escape(heading)}\n(?P<body>.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"no '## {heading}' section"
    return match["body"]


def doc_pages() -> set[str]:
    return {p.name for p in DOCS.glob("*.md")}


def test_readme_model_list_is_the_catalogs() -> None:
    readme = README.read_text(encoding="utf-8")
    begin, end = readme.find(MODEL_LIST_BEGIN), readme.find(MODEL_LIST_END)
    assert 0 <= begin < end, "README.md has no model list markers"
    assert readme[begin:end + len(MODEL_LIST_END)] == model_list(), f"paste into README.md:\n{model_list()}"


def test_the_model_list_names_every_model_module_and_what_it_declares() -> None:
    rows = [line for line in model_list().splitlines() if line.startswith("| `")]
    assert ("| `gemma3` | `Gemma3Processor` | native processor | option `max_pan_and_scan_crops`, "
            "reference encoder, backend placeholders, vLLM native inputs |") in rows
    assert "| `qwen2_5_vl` | `Qwen2_5_VLProcessor` | transformers backend | reference encoder, M-RoPE positions, " \
           "video metadata, vLLM native inputs |" in rows
    assert "| `smolvlm` | `SmolVLMProcessor` | transformers backend | vLLM native inputs |" in rows
    assert "| `glmasr` | `GlmAsrProcessor` | transformers backend | vLLM native inputs |" in rows
    assert len(rows) == len(model_specs()) and not any("`emu3`" in row for row in rows)


def test_readme_lists_every_page_of_docs() -> None:
    linked = {m["page"] for m in DOC_LINK.finditer(section(README.read_text(encoding="utf-8"), "Documentation"))}
    assert linked == doc_pages()


def test_docs_index_page_table_lists_every_other_page_of_docs() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    table = index[:index.index("\n## ")]
    assert {m["page"] for m in DOC_LINK.finditer(table)} == doc_pages() - {"index.md"}
