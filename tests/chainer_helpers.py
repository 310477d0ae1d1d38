"""Scripts that the Chainer tests run in Chainer's own interpreter (FASTFLIP_CHAINER_PYTHON, see tests/test_chainer.py).

:func:`chainer_script` writes the part every such script shares (the imports and a chain ``Net`` of given links);
each test adds what it saves and loads.
"""

from __future__ import annotations

import textwrap
from typing import Mapping

_HEAD = '''import sys
import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
'''


def chainer_script(links: Mapping[str, str], rest: str) -> str:
    """The source of a Chainer script: ``sys``, ``np``, ``chainer``, ``F`` and ``L`` imported, a chain ``Net`` whose
    links are ``links`` (attribute -> constructor, e.g. ``{"fc": "L.Linear(4, 3)"}``), then ``rest`` dedented.

    Lines of ``rest`` indented one level more than its least indented lines (e.g. a ``forward``) belong to ``Net``.
    """
    return _HEAD + "".join(f"            self.{name} = {link}\n" for name, link in links.items()) + \
        textwrap.dedent(rest)
