"""The files of a run or sweep directory: the one rule for every file the program writes, removes
or reads there, and its helpers.

Every such file (a checkpoint's, ``config.json``, ``metrics.csv``, ``tb/``, ``figures/``, a
sweep's logs and reports, the lock, an export) is a regular file (or folder) of the run's own:
never a symbolic link, and one that is written or removed is not hard-linked to another name
either. A new version is written to a temporary name and renamed into place (`atomic_write`);
appends (`open_own`), removals (`remove_file`), folders (`own_folder`) and reads (`read_own`,
which is bounded) check the same. A planted link is refused with one line (`CheckpointError`)
and left alone.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["CheckpointError", "atomic_write", "remove_file", "open_own", "own_folder",
           "read_own", "check_own", "refuse_foreign"]


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def refuse_foreign(path: Path, st: os.stat_result, write: bool = True) -> None:
    """Raise `CheckpointError` unless ``st`` (``path``'s `os.lstat`) is a regular file of the
    run's own: not a symbolic link, and (``write``: to write or remove it) not hard-linked."""
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path}: is a symbolic link; torch-ntm never reads or writes "
                              f"through a link in a run: remove the link (its target is left "
                              f"alone)")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: not a regular file; remove it or choose another "
                              f"directory")
    if write and st.st_nlink > 1:
        raise CheckpointError(f"{path}: is hard-linked ({st.st_nlink} names for one file); "
                              f"torch-ntm writes or removes only a run's own files: remove "
                              f"this name (the other ones keep the file)")


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror})") from None


def check_own(path: Path) -> None:
    """`refuse_foreign` for a file about to be written or removed (nothing if it is absent)."""
    st = _lstat(path)
    if st is not None:
        refuse_foreign(path, st)


def remove_file(path: str | os.PathLike) -> None:
    """Remove ``path`` if it is there; a link or other foreign file is refused, and kept."""
    path = Path(path)
    check_own(path)
    path.unlink(missing_ok=True)


def own_folder(path: str | os.PathLike) -> Path:
    """The folder ``path`` of a run (``figures/``, ``tb/``, a sweep's ``seed-S/``), made if it is
    not there (with its parents); a symbolic link or a file in its place is refused."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as e:
        raise CheckpointError(f"{path}: cannot make the folder ({e.strerror})") from None
    st = _lstat(path)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path}: is a symbolic link; torch-ntm never writes through a "
                              f"link in a run: remove the link (its target is left alone)")
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{path}: exists and is not a directory; remove it or choose "
                              f"another directory")
    return path


def open_own(path: str | os.PathLike, append: bool = True):
    """``path`` opened for writing (binary; appending, or replacing what it held), created if
    absent; a link or other foreign file in its place is refused, and kept."""
    path = Path(path)
    if not append:
        remove_file(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_foreign(path, os.lstat(path))
        raise
    try:
        refuse_foreign(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def read_own(path: str | os.PathLike, limit: int, what: str, digest=None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (``what`` says which
    kind, for the message), read in blocks that update ``digest`` (a hashlib object) if given.

    Raises:
        FileNotFoundError: ``path`` is not there.
        CheckpointError: a symbolic link, a FIFO, a device or a folder; or larger than
            ``limit``; or unreadable.
    """
    path = Path(path)
    try:  # O_NONBLOCK: a FIFO opens at once (and is then refused) instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_foreign(path, os.lstat(path), write=False)
        raise CheckpointError(f"{path}: cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        refuse_foreign(path, st, write=False)
        if st.st_size > limit:
            raise CheckpointError(f"{path}: is {st.st_size:,} bytes, more than the {limit:,} "
                                  f"a {what} may hold; it is not one")
        data = bytearray()
        try:
            for block in iter(lambda: f.read(1 << 20), b""):
                data += block
                if digest is not None:
                    digest.update(block)
                if len(data) > limit:  # grown since fstat
                    raise CheckpointError(f"{path}: holds more than the {limit:,} bytes a "
                                          f"{what} may hold; it is not one")
        except OSError as e:
            raise CheckpointError(f"{path}: cannot be read ({e.strerror})") from None
    return bytes(data)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either the old or the complete new file.

    A link or other foreign file at ``path`` is refused (`CheckpointError`) and kept."""
    path = Path(path)
    check_own(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give what open() would
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a full disk, a file size limit
            raise OSError(e.errno, e.strerror, str(path)) from None  # name the file written
        raise
