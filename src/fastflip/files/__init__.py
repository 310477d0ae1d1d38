"""File layer: checkpoints on disk, read, selected, altered in place and logged.

HDF5 layout and framework roles (:mod:`~fastflip.files.layout`, :mod:`~fastflip.files.roles`), tensor
selection (:mod:`~fastflip.files.select`), applying plans to HDF5 storage
(:mod:`~fastflip.files.h5apply`, :mod:`~fastflip.files.h5chunks`, :mod:`~fastflip.files.patches`),
the file injection front end (:mod:`~fastflip.files.inject`), the injection log
(:mod:`~fastflip.files.log`, :mod:`~fastflip.files.logcheck`), checkpoint comparison
(:mod:`~fastflip.files.diff`), other file formats (:mod:`fastflip.files.formats`), Keras ``.keras``
archives (:mod:`~fastflip.files.keras_archive`), and safe file handling (:mod:`~fastflip.files.fileio`,
:mod:`~fastflip.files.paths`, :mod:`~fastflip.files.locks`).

Imports: :mod:`fastflip.errors`, ``core`` and ``kernels``. Imported by ``live`` and above.
"""
