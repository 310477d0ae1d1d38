"""Build the native extensions (Cython sources in ext/); all metadata lives in pyproject.toml.

The Cython kernels are optional at build time: without Cython or a C compiler the build
still succeeds, as a pure-Python package that uses the NumPy (and, when installed, Numba)
backends. ``fastflip info`` says which backends are active.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the kernels when a compiler is there; otherwise say so once and go on."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, or a broken one
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skipped(exc)

    @staticmethod
    def _skipped(exc: Exception) -> None:
        if os.environ.get("FASTFLIP_REQUIRE_NATIVE") == "1":
            raise exc
        print(f"fastflip: Cython kernels not built ({exc}); the NumPy/Numba backends will be used", file=sys.stderr)


def extensions() -> list:
    try:
        import numpy as np
        from Cython.Build import cythonize
    except ImportError as exc:
        print(f"fastflip: Cython kernels not built ({exc}); the NumPy/Numba backends will be used", file=sys.stderr)
        return []
    ext = Extension(
        "fastflip.kernels._cython",
        ["ext/_kernels.pyx"],
        include_dirs=[np.get_include(), "src/fastflip/kernels"],  # ff_word.h: the word rule in C
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
    lzf = Extension("fastflip.kernels._lzf", ["ext/_lzf.pyx"], extra_compile_args=["-O3"])
    # HDF5 chunk index in C: calls the libhdf5 h5py loaded through addresses given at run time (links nothing)
    h5c = Extension("fastflip.kernels._h5chunks", ["ext/_h5chunks.pyx"], include_dirs=[np.get_include()],
                    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")], extra_compile_args=["-O3"])
    return cythonize([ext, lzf, h5c], language_level=3, compiler_directives={"boundscheck": False, "wraparound": False})


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
