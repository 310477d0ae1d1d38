"""Build the native extensions (Cython sources in ext/); all metadata lives in pyproject.toml."""

from Cython.Build import cythonize
import numpy as np
from setuptools import Extension, setup

extensions = [
    Extension(
        "fastflip._kernels",
        ["ext/_kernels.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={"boundscheck": False, "wraparound": False}))
