"""Sphinx configuration: the reference is built from the numpydoc docstrings (``make docs``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

import fastflip  # noqa: E402

project = "fastflip"
author = "The fastflip authors"
copyright = "2026, The fastflip authors"
release = version = fastflip.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True
# "path" in a numpydoc type means str or os.PathLike, not one of the many attributes named path.
napoleon_type_aliases = {"path": "path-like"}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
# Each object is documented once, in the module that defines it (packages re-export names for users).
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True, "ignore-module-all": True}
# Optional extras are imported lazily inside functions; mock the few imported at module level by adapters.
autodoc_mock_imports = ["cupy", "numba", "dask", "distributed", "tensorflow", "keras", "torch"]
myst_heading_anchors = 3
# "more than one target found" for short type names (path, name) that several classes use as attributes:
# the reference is still rendered, only not linked. Every other warning fails `make docs`.
suppress_warnings = ["myst.xref_missing", "myst.header", "ref.python"]
html_theme = "pydata_sphinx_theme"
html_title = "fastflip"
html_theme_options = {"navigation_depth": 2}
