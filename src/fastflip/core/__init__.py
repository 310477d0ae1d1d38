"""Core layer: the fault-model primitives, with no file, framework or kernel I/O.

Word types and float formats (:mod:`~fastflip.core.dtypes`, :mod:`~fastflip.core.floatformats`), bit
specs (:mod:`~fastflip.core.bits`), fault models (:mod:`~fastflip.core.faults`), plans and sampling
(:mod:`~fastflip.core.plan`, :mod:`~fastflip.core.sampling`, :mod:`~fastflip.core.permutation`), the
word rule in vectorised NumPy (:mod:`~fastflip.core.wordrule`) and the site-by-site oracle
(:mod:`~fastflip.core.reference`), and config type checks (:mod:`~fastflip.core.configcheck`).

Imports: only :mod:`fastflip.errors` and other ``core`` modules. Every other layer may import it.
"""
