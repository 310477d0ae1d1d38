"""Datasets that Keras 3's weights loader reads otherwise than h5py: the ``dtype = "bfloat16"`` attribute.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Keras 3 writes a bfloat16 variable into ``.weights.h5`` (and the ``model.weights.h5`` of a ``.keras``
archive) as an HDF5 dataset of opaque 2-byte words (NumPy ``|V2``) carrying the attribute
``dtype = "bfloat16"``. Its loader (``H5IOStore.__getitem__`` in ``keras/src/saving/saving_lib.py``) reads a
``vars/<key>`` dataset so::

    if "dtype" in value.attrs and value.attrs["dtype"] == "bfloat16":
        value = np.array(value, dtype=ml_dtypes.bfloat16)

h5py reads the same dataset as raw bytes (``|V2``), not numbers. :func:`keras_reading` says how Keras's loader
reads a dataset with a ``dtype`` attribute: as bfloat16 words (an untagged opaque 2-byte type, whose bytes
HDF5 copies unchanged into the ``ml_dtypes.bfloat16`` array, in this machine's byte order), or not at all
(why, in one line: the attribute is compared as Keras compares it, so ``b"bfloat16"`` or a list of two strings
does not count, and a float32, int16 or tagged opaque dataset has no HDF5 conversion to bfloat16).
:func:`settle` then picks, per dataset, the reading of the framework that reads the file: Keras's in a file its
weights writer could produce (every dataset a ``vars/<key>`` entry, at any depth, and no legacy marker:
:func:`fastflip.files.roles.keras3_written`), h5py's in any other file.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> path = os.path.join(tempfile.mkdtemp(), "w.weights.h5")
>>> with h5py.File(path, "w") as f:
...     ds = f.create_dataset("layers/dense/vars/0", data=np.array([0x3F80], "<u2").view("V2"))
...     ds.attrs["dtype"] = "bfloat16"
>>> with h5py.File(path, "r") as f:
...     keras_reading(f["layers/dense/vars/0"].id)
'bfloat16'
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["KerasReading", "keras_reading", "settle", "BF16_WORDS", "stored_words", "WordsView"]

KERAS_DTYPE_ATTR = b"dtype"
BF16_WORDS = np.dtype(np.uint16)  # native order: the bytes land unchanged in an ml_dtypes.bfloat16 array


class KerasReading:
    """A dataset as two frameworks read it: ``plain`` (h5py) and ``keras`` (Keras 3's weights loader).

    Each is what :func:`fastflip.files.layout.read_layout` keeps for a dataset: the fields of its
    :class:`~fastflip.core.records.Tensor`, or the reason it is skipped.
    """

    __slots__ = ("plain", "keras")

    def __init__(self, plain: "dict[str, Any] | str", keras: "dict[str, Any] | str") -> None:
        self.plain, self.keras = plain, keras


def _attr_text(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def keras_reading(dsid: Any) -> "str | None":
    """How Keras 3's loader reads a dataset (low-level ``DatasetID``) by its ``dtype`` attribute.

    Returns ``None`` when the attribute does not make Keras read it otherwise than h5py (absent, or another
    value on a numeric dataset), ``"bfloat16"`` when Keras reads its words as bfloat16, else why Keras's loader
    cannot read it (one line).
    """
    from h5py import Dataset, h5a, h5t

    if not h5a.exists(dsid, KERAS_DTYPE_ATTR):
        return None
    tid = dsid.get_type()
    opaque = tid.get_class() == h5t.OPAQUE
    try:
        value = Dataset(dsid).attrs["dtype"]
    except (OSError, TypeError, ValueError, KeyError) as exc:
        return f"its dtype attribute cannot be read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    try:
        is_bf16 = bool(value == "bfloat16")  # as Keras compares it: str only, an array only of one element
    except (ValueError, TypeError):
        return (f"its dtype attribute {_attr_text(value)} makes Keras's loader fail (the truth value of its "
                "comparison with 'bfloat16' is ambiguous)")
    if not is_bf16:
        if opaque:
            return (f"opaque {tid.get_size()}-byte words whose dtype attribute is {_attr_text(value)}, not 'bfloat16' "
                    "(Keras's loader cannot cast them)")
        return None
    if opaque and tid.get_size() == 2 and tid.get_tag() == b"":
        return "bfloat16"
    what = (f"opaque words tagged {tid.get_tag()!r}" if opaque and tid.get_size() == 2
            else f"{tid.get_size()}-byte opaque words" if opaque else f"{np.dtype(tid.dtype)} values")
    return (f"its dtype attribute says 'bfloat16' but it stores {what}: Keras's loader cannot read it "
            "(HDF5 has no conversion to bfloat16)")


def settle(described: "dict[str, Any] | str | KerasReading", keras3: bool) -> "dict[str, Any] | str":
    """The reading of a dataset that fastflip keeps: Keras's in a Keras 3 weights file (``keras3``: every dataset a
    ``vars/<key>`` entry, :func:`fastflip.files.roles.keras3_written`, and framework ``keras3``), h5py's
    otherwise."""
    if not isinstance(described, KerasReading):
        return described
    return described.keras if keras3 else described.plain


def stored_words(values: Any, dtype: np.dtype) -> np.ndarray:
    """Values read through h5py as ``dtype``: opaque words of its width (h5py's raw bytes of a Keras bfloat16
    variable) are viewed as they are stored (no copy); other values are returned as h5py read them.

    >>> stored_words(np.array([0x3F80], "<u2").view("V2"), np.dtype("<u2")).tolist()
    [16256]
    """
    values = np.asarray(values)
    if values.dtype.kind == "V" and values.dtype.itemsize == np.dtype(dtype).itemsize:
        return values.view(dtype)
    return values


class WordsView:
    """An h5py dataset sliced as :func:`stored_words` (``view[sl]``): a Keras bfloat16 variable as uint16 words,
    any other dataset as h5py reads it."""

    def __init__(self, ds: Any, dtype: np.dtype) -> None:
        self._ds, self._dtype = ds, dtype

    def __getitem__(self, sl: Any) -> np.ndarray:
        return stored_words(self._ds[sl], self._dtype)
