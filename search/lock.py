"""One driver per study: a lock taken before the study opens and held for the whole run.

Two drivers of one study measure its baseline twice, fail each other's trials as ``port_busy``,
overshoot ``--n-trials``, and one can re-measure while the other believes it is done; on a new
SQLite file both create its tables at once and one dies. So `search study run` takes the study's
lock before it touches the storage and keeps it through the re-measurement; a second driver is
refused with exit 2, naming the first's pid and host.

The lock is ``flock(2)`` on a file, so the kernel lets go of it when its driver dies, ``kill -9``
included: there is never a stale lock to clean up, and the next run resumes as before. The files
live next to an SQLite database (``studies.db.locks/``), where every driver of that file looks;
for a server storage (PostgreSQL) in ``~/.cache/search/locks/<hash of the URL>/``, which only the
drivers of this machine see: a driver on another machine is still refused once the first has a
trial running (`search.study`), but not before.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from optuna.storages import BaseStorage

from search.errors import BadInput
from search.names import checked_study_name
from search.storage import open_storage, sqlite_path


def lock_dir(storage: str) -> Path:
    """Where the locks of ``storage``'s studies live: beside an SQLite file, else this user's cache."""
    path = sqlite_path(storage)
    if path is not None:
        return Path(f"{path}.locks")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "search" / "locks" / hashlib.sha256(storage.encode()).hexdigest()[:16]


class StudyLock:
    """``with StudyLock(storage, name):`` holds study ``name``'s lock, or raises BadInput naming its holder.

    Entering also opens the storage (``opened``, through `search.storage.open_storage`, so a broken
    one is a one-line BadInput) and creates its tables while holding a lock of the whole storage,
    so that drivers of different studies starting together on a new file do not create them twice.
    """

    def __init__(self, storage: str, study: str) -> None:
        self.storage = storage
        self.study = checked_study_name(study)
        self.directory = lock_dir(storage)
        self.path = self.directory / f"study-{study}.lock"
        self._fd: int | None = None
        self._opened: BaseStorage | None = None

    @property
    def opened(self) -> BaseStorage:
        """The storage, open while the lock is held."""
        assert self._opened is not None, "the storage is open only inside the lock"
        return self._opened

    def __enter__(self) -> Self:
        try:
            self.directory.mkdir(parents=not self.directory.name.endswith(".locks"), exist_ok=True)  # a cache folder is ours to make
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise BadInput(f"--storage {self.storage}: cannot create the study's lock {self.path} "
                           f"({exc.strerror}); make its directory exist and writable, or give another --storage") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise
            raise BadInput(f"study {self.study!r} is being run by {holder} ({self.path}); a study has one driver: "
                           "wait for that run, or stop it (kill PID tears its trial down), then run the same "
                           "command to continue") from None
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode(), 0)
            self._opened = self._open()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock; the file stays, so that no later driver races its removal
            self._fd = None
            self._opened = None

    def _open(self) -> BaseStorage:
        fd = os.open(self.directory / "storage.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # brief: only while another driver creates the tables
            return open_storage(self.storage, create=True)
        finally:
            os.close(fd)


def _holder(fd: int, wait_s: float = 1.0) -> str:
    """``pid 123 on host gpu-ctl`` from the lock file; the holder writes it just after locking, so
    an empty file is read again for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            data = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return f"pid {int(data['pid'])} on host {data['host']}"
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return "another driver (it has not said which yet)"
            time.sleep(0.05)
