"""The public fixtures API: the only names of :mod:`mmfront.testing` and :mod:`mmfront.fixtures`
that product code calls.

Three commands run on fixtures by design: ``mmfront demo`` serves the cached default model (Gemma 3's
processor at real sizes, with small random weights) and sends it seeded images, ``mmfront
models`` surveys every hooked HF processor on small offline folders, and ``mmfront fixtures``
writes one of those folders for a user to serve. They import these names from here and nothing
else of the test code (``tests/test_architecture.py`` checks it), so what the
product depends on is this list, and the rest of the test code can change freely.
"""

from __future__ import annotations

from mmfront.testing.coverage import HOOKED_PROCESSORS, render_table, replace_table, survey_all
from mmfront.testing.families import Family, build_family_folder, families
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import DEFAULT_MODEL_KIND, cached_model_dir

__all__ = [
    "DEFAULT_MODEL_KIND",
    "HOOKED_PROCESSORS",
    "Family",
    "build_family_folder",
    "cached_model_dir",
    "families",
    "image_data_url",
    "make_image",
    "render_table",
    "replace_table",
    "survey_all",
]
