"""Compatibility with the older checkpoint corrupter (hdf5_corrupter): its sampling, value rules and files.

Layer: ``compat`` (may import experiment and below; imported by cli).

``oldtool`` (core primitives only) simulates the older tool's injection loop and returns a fastflip Plan;
``run`` (orchestration) reads a checkpoint, runs either design and writes the output, fastflip's log and
the older tool's injection-sequence JSON. The settings themselves are read by :mod:`fastflip.compat.oldconfig`.
See ``docs/oldtool.md``.
"""
