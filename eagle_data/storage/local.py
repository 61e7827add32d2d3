"""A folder as the shard store's file system: atomic renames, exclusive hard links, fsync'd appends."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eagle_data.storage.errors import ROOT_ENV, StorageError, UnwritableRoot

FILE_MODE = 0o666  # what open() asks for; the process umask takes away the rest, as for any file it writes
# what to say when the output root refuses a write, by errno (others quote the system's own words)
WRITE_FAILURES = {
    errno.EACCES: "is not writable (permission denied)",
    errno.EPERM: "is not writable (operation not permitted)",
    errno.EROFS: "is on a read-only file system",
    errno.ENOSPC: "is full (no space left on device)",
    errno.EDQUOT: "is over its disk quota",
    errno.ENOTDIR: "is not a folder (a file is in the way)",
}
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})  # no retry helps until someone acts


def write_failure(root: str, key: str, exc: OSError) -> StorageError:
    """One line for a write the output root refused: which root, why, and what to do."""
    why = WRITE_FAILURES.get(exc.errno or 0, f"refused the write ({exc.strerror or exc})")
    message = (
        f"cannot write {key} under the output root {root}: it {why}; free space or make it writable, or point "
        f"{ROOT_ENV} at another folder"
    )
    return UnwritableRoot(message, root, why) if exc.errno in UNWRITABLE else StorageError(message)


class LocalFiles:
    """Keys as files under a folder. A reader never sees a half-written file: a temp file is written beside
    the key, fsync'd and renamed (or hard-linked, for an exclusive create) into place."""

    can_append = True

    def __init__(self, root: str) -> None:
        self.root = root

    def check(self) -> None:
        """Refuse a root that is a file, before anything is written or paid for."""
        if Path(self.root).exists() and not Path(self.root).is_dir():
            raise StorageError(f"{ROOT_ENV}={self.root} is a file, not a folder: point {ROOT_ENV} at a folder")

    def path(self, key: str) -> Path:
        return Path(self.root, key)

    def link(self, key: str) -> str:
        return self.path(key).as_uri()

    def move_command(self, uri: str, aside: str) -> str:
        return f"mv {uri} {aside}"

    def write(self, key: str, data: bytes) -> None:
        try:
            _write_atomically(self.path(key), data)
        except OSError as exc:
            raise write_failure(self.root, key, exc) from None

    def append(self, key: str, data: bytes) -> None:
        """Append and fsync: durable when this returns. A failed append (a full disk mid-write) is cut back
        to the old end, so its retry neither tears nor repeats a line."""
        path = self.path(key)
        try:
            created = not path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as fh:
                end = fh.tell()
                try:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                except OSError:
                    with contextlib.suppress(OSError):
                        fh.truncate(end)
                    raise
            if created:  # the new name must survive a crash too
                _fsync_dir(path.parent)
        except OSError as exc:
            raise write_failure(self.root, key, exc) from None

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """A complete temp file hard-linked to the name: link(2) fails when the name exists, as
        O_CREAT|O_EXCL does, without a reader ever seeing a half-written file."""
        path = self.path(key)
        try:
            tmp = _write_temp(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise write_failure(self.root, key, exc) from None
        return True

    @contextmanager
    def staged(self, key: str, sync: bool) -> Iterator[Path]:
        """A temp file beside `key`, renamed over it on a clean exit."""
        folder = self.path(key).parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = _new_temp(folder, Path(key).name)
        os.close(fd)
        try:
            yield tmp
            try:
                if sync:
                    with tmp.open("rb+") as fh:
                        os.fsync(fh.fileno())
                os.replace(tmp, self.path(key))
                if sync:
                    _fsync_dir(folder)
            except OSError as exc:
                raise write_failure(self.root, key, exc) from None
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
        )

    def download(self, key: str, path: Path) -> None:
        shutil.copyfile(self.path(key), path)

    @contextmanager
    def local(self, key: str) -> Iterator[Path]:
        """The file itself: it already is on this machine."""
        yield self.path(key)

    def move(self, key: str, new_key: str) -> None:
        os.replace(self.path(key), self.path(new_key))

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)


def _write_temp(path: Path, data: bytes) -> Path:
    """A complete, fsync'd temp file beside `path`, to be renamed or linked into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _new_temp(folder: Path, name: str) -> tuple[int, Path]:
    """A new temporary file `.{name}.{random}.tmp` in `folder`, open for writing. Made like any file (FILE_MODE
    less the umask, which the kernel applies), where mkstemp makes 0600 files that would need a chmod and a
    read of the umask: a tenth of a millisecond per file, which counts for captures of many small files."""
    while True:
        path = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE), path
        except FileExistsError:
            continue


def _write_atomically(path: Path, data: bytes) -> None:
    """Write a temp file beside `path`, fsync it and rename it into place: readers see all or nothing."""
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
