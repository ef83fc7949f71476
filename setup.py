"""Builds the optional C extension; every other setting lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and mmfront packs PIL pixels
with Pillow's own (slower) packer instead (see mmfront.pixels).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("mmfront._pixels", ["src/mmfront/_pixels.c"], optional=True, extra_compile_args=["-O3"]),
    ],
)
