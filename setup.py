"""Builds the optional C extensions; every other setting lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and mmfront packs PIL pixels
with Pillow's own (slower) packer and resizes with torch instead (see mmfront.pixels and
mmfront.bicubic).
"""

from setuptools import Extension, setup

SHARED_HEADERS = ["src/mmfront/_index_arg.h", "src/mmfront/_split3.h"]

setup(
    ext_modules=[
        Extension("mmfront._pixels", ["src/mmfront/_pixels.c"], depends=SHARED_HEADERS, optional=True,
                  extra_compile_args=["-O3"]),
        Extension("mmfront._bicubic", ["src/mmfront/_bicubic.c"], depends=SHARED_HEADERS, optional=True,
                  extra_compile_args=["-O3"]),
    ],
)
