"""Copies that share blocks where the file system can, and never link: for outputs a later in-place write must
not carry back into the input.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A reflink (``FICLONE``: btrfs, XFS, bcachefs, ...) makes the copy share the source's blocks copy-on-write:
instant, and a write to either file changes only that file. Elsewhere the bytes are copied
(``os.copy_file_range``, in the kernel; then a plain read/write). Hard links and symbolic links are never
made: a later ``--in-place`` injection into the copy would change the original through them.

Examples
--------
>>> import os, tempfile
>>> d = tempfile.mkdtemp(); a = os.path.join(d, "a"); b = os.path.join(d, "b")
>>> _ = open(a, "wb").write(b"weights")
>>> share_copy(a, b) in ("reflink", "copy"), open(b, "rb").read(), os.path.samefile(a, b)
(True, b'weights', False)
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from typing import Container

from .fileio import fsync_path
from .paths import is_fastflip_scratch

__all__ = ["FICLONE", "share_copy", "copy_tree"]

FICLONE = 0x40049409  # ioctl: make the destination share the source's blocks (btrfs, XFS, bcachefs, ...)


def share_copy(src: str, dst: str, durable: bool = False) -> str:
    """Copy ``src`` to the new file ``dst``; return how: ``'reflink'`` (blocks shared copy-on-write) or ``'copy'``.

    Never a hard or symbolic link: writing ``dst`` later never changes ``src``. A symbolic link
    ``src`` is followed (``dst`` is a regular file with its bytes). ``durable``: fsync ``dst``.
    """
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        try:
            fcntl.ioctl(fo.fileno(), FICLONE, fi.fileno())
            how = "reflink"
        except OSError:
            how = "copy"
            size = os.fstat(fi.fileno()).st_size
            try:  # an in-kernel copy (shares blocks on some file systems, copies on others)
                done = 0
                while done < size:
                    n = os.copy_file_range(fi.fileno(), fo.fileno(), size - done)
                    if n == 0:
                        break
                    done += n
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM):
                    raise
                fi.seek(0)
                fo.seek(0)
                fo.truncate()
                shutil.copyfileobj(fi, fo, 1 << 20)
        if durable:
            fo.flush()
            os.fsync(fo.fileno())
    shutil.copymode(src, dst)
    return how


def copy_tree(src: str, dst: str, skip: Container[str], durable: bool = False) -> dict[str, int]:
    """Carry every file of ``src`` into the existing directory ``dst`` (but ``skip``, and fastflip's own temporaries
    and writer-lock records); count how."""
    how = {"reflink": 0, "copy": 0}
    for e in sorted(os.scandir(src), key=lambda e: e.name):
        if e.name in skip or is_fastflip_scratch(e.name):  # temporaries and lock records of a writer at work
            continue
        if e.is_dir():  # a subdirectory (or a link to one): its files, as real files
            os.mkdir(os.path.join(dst, e.name))
            for k, v in copy_tree(e.path, os.path.join(dst, e.name), set(), durable).items():
                how[k] += v
            if durable:
                fsync_path(os.path.join(dst, e.name))
        elif e.is_file():
            how[share_copy(e.path, os.path.join(dst, e.name), durable)] += 1
    return how
