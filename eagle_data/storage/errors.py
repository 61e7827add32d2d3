"""The storage errors every backend raises: one line naming the location and the fix."""

from __future__ import annotations

from eagle_data.types import UserError

ROOT_ENV = "EAGLE_DATA_ROOT"


class StorageError(UserError, RuntimeError):
    """A storage problem the user must fix; the message names the location and the fix."""


class CorruptFile(StorageError):
    """A stored file that cannot be read (a torn write, a disk fault): `key` names it, `why` says what is wrong."""

    def __init__(self, message: str, key: str, why: str) -> None:
        super().__init__(message)
        self.key, self.why = key, why


class UnwritableRoot(StorageError):
    """A local output root that refuses every write until someone acts (full, over quota, read-only): no
    outage to wait out, so a run stops sending at once. `root` and `why` ("is full ...") name it."""

    def __init__(self, message: str, root: str, why: str) -> None:
        super().__init__(message)
        self.root, self.why = root, why
