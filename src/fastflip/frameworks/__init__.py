"""Framework layer: codecs and trainers for deep-learning frameworks.

:mod:`~fastflip.frameworks.torch_state` (PyTorch state_dicts to and from HDF5, bit-exact),
:mod:`~fastflip.frameworks.convert` (checkpoint formats converted to HDF5 and back) and
:mod:`fastflip.frameworks.trainers` (train/evaluate protocols for PyTorch and Keras). The frameworks
themselves (torch, tensorflow) are imported lazily inside the functions that need them.

Imports: :mod:`fastflip.errors`, ``core``, ``kernels``, ``files`` and ``live``. Imported by
``campaign``, ``experiment`` and above.
"""
