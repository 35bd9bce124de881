"""Writing an output file (a report, an export) so that it never harms what is already there.

The target is checked before any work is done: a path that exists must be a regular file (a
folder, a device such as ``/dev/full``, a FIFO or a symbolic link is refused: writing through a
link would replace whatever it points to). The bytes go to a temporary file beside the target,
and are renamed onto it once complete, so a reader never sees half a report and a failure leaves
the old one in place.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from forensics.errors import OutputRefused
from forensics.text import shown


def check_target(path: Path) -> None:
    """Refuse ``path`` as an output unless it is new or a regular file (not a link to one)."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        folder = next((p for p in path.parents if p.exists()), None)  # the nearest that is there
        if folder is not None and not folder.is_dir():
            raise OutputRefused(f"{shown(path)}: {shown(folder)} is not a folder") from None
        return
    if stat.S_ISLNK(mode):
        raise OutputRefused(f"{shown(path)}: a symbolic link; name the file itself (nothing is written through links)")
    if stat.S_ISDIR(mode):
        raise OutputRefused(f"{shown(path)}: a folder; name a file to write")
    if not stat.S_ISREG(mode):
        raise OutputRefused(f"{shown(path)}: not a regular file (a device, FIFO or socket); name a file to write")


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (checked by :func:`check_target`): into a temporary file beside
    it, flushed to disk, then renamed onto it. Its mode is what the umask gives a new file."""
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        check_target(path)  # (still nothing else, after the work)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
