"""Every HF processor with a ``replace_<modality>_token`` hook, built offline and served by
``create_processor(folder)``, proven equal to HF's own processor call (``mmfront.testing.coverage``):
ids, placeholder ranges and ``is_embed`` masks for 1, 2 and 3 items of different sizes with text
before, between and after; each item's tensors equal to HF's slice of the batch and to HF on the
item alone; a repeated request a cache hit equal to the miss; hashes equal in another process.

Each folder is built once per session. Under transformers 5.14.1 the Legacy backend serves the
same families where that version has them. ``docs/models.md`` holds the generated table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import transformers

import preloaded
from mmfront import errors
from mmfront.errors import MMFrontError
from mmfront.fixtures.overrides import OVERRIDES
from mmfront.testing import coverage
from mmfront.testing.coverage import HOOKED_PROCESSORS, Coverage

pytestmark = pytest.mark.backend

ROOT = Path(__file__).parents[3]
NEWEST = "5.24"


@pytest.fixture(scope="session")
def survey_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("coverage")


_OUTCOMES: dict[str, Coverage] = {}


_SURVEY = ("import dataclasses, json, sys\n"
           "from pathlib import Path\n"
           "from mmfront.testing import coverage\n"
           "print(json.dumps(dataclasses.asdict(coverage.survey_processor(sys.argv[1], Path(sys.argv[2])))))\n")


def outcome(name: str, folder: Path) -> Coverage:
    """The survey's outcome for ``name``, found once per session, in a fork of the preloaded
    interpreter: a processor's outcome must not depend on what this worker ran before (a
    docs/processing.md block once left its example processor registered for ``LlavaProcessor``;
    tests/test_docs.py now gives each page its own catalogs)."""
    if name not in _OUTCOMES:
        done = preloaded.run([sys.executable, "-c", _SURVEY, name, str(folder / name)], timeout=300, check=True)
        found = json.loads(done.stdout.strip().splitlines()[-1])
        _OUTCOMES[name] = Coverage(**{**found, "modalities": tuple(found["modalities"])})
    return _OUTCOMES[name]


@pytest.mark.parametrize("name", HOOKED_PROCESSORS)
def test_processor_is_served_and_equals_hf_or_refused_with_a_typed_error(name: str, survey_dir: Path) -> None:
    if not coverage.has_processor_class(name):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (it is in transformers {NEWEST})")
    found = outcome(name, survey_dir)
    if found.status == coverage.MISMATCH:
        known = OVERRIDES.get(name)
        if known is not None and known.known_mismatch:
            pytest.xfail(known.known_mismatch)
        pytest.fail(f"{name}: {found.reason}")
    if found.status == coverage.REFUSED:
        assert issubclass(getattr(errors, found.error), MMFrontError)
        assert name in found.reason, f"the refusal does not name the processor: {found.reason}"
        return
    if found.status != coverage.SERVED:
        pytest.skip(f"{name}: {found.status}: {found.reason}")
    assert found.modalities and set(found.hashes) == set(found.modalities)


def test_hashes_are_the_same_in_another_process(survey_dir: Path) -> None:
    outcomes = [outcome(name, survey_dir) for name in HOOKED_PROCESSORS if coverage.has_processor_class(name)]
    served = {c.processor_class: c for c in outcomes if c.status == coverage.SERVED}
    assert served
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from mmfront.testing.coverage import request_hashes\n"
        "jobs = json.loads(sys.argv[1])\n"
        "print(json.dumps({n: request_hashes(Path(f), n, m) for n, (f, m) in jobs.items()}))\n"
    )
    jobs = {name: (str(survey_dir / name), {m: len(h) for m, h in c.hashes.items()}) for name, c in served.items()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = preloaded.run([sys.executable, "-c", script, json.dumps(jobs)], timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    other = json.loads(done.stdout.strip().splitlines()[-1])
    assert other == {name: c.hashes for name, c in served.items()}


@pytest.mark.hf_version(f">={NEWEST}", reason=f"the survey's list is transformers {NEWEST}'s hooked processors")
def test_the_survey_lists_every_hooked_processor() -> None:
    assert list(HOOKED_PROCESSORS) == coverage.hooked_processor_classes()


@pytest.mark.hf_version(f">={NEWEST}", reason=f"docs/models.md is generated under transformers {NEWEST}")
def test_docs_models_table_is_the_generated_one(survey_dir: Path) -> None:
    outcomes = [outcome(name, survey_dir) for name in HOOKED_PROCESSORS]
    document = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    regenerated = coverage.replace_table(document, coverage.render_table(outcomes))
    assert document == regenerated, "docs/models.md is out of date: run `mmfront models --write docs/models.md`"
