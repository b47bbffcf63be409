"""A real PostgreSQL server for the storage tests, started as tests/ssh starts sshd.

Debian's `postgresql` package (scripts/setup.sh --test) gives ``initdb`` and ``pg_ctl``; PostgreSQL
refuses to run as root, so under root the cluster belongs to the ``postgres`` user the package
creates. The cluster lives in a fresh directory, listens on a free loopback port and trusts local
connections; it is stopped (``-m immediate``) and removed at the end.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import free_port


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if found is None:
        raise RuntimeError(f"no {name}: run `bash scripts/setup.sh --test` (apt-get install -y postgresql)")
    return found


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a throwaway PostgreSQL server; yields the ``postgresql://`` URL of its database."""
    root = Path(tempfile.mkdtemp(prefix="search-pg-"))  # not under pytest's root-only tmp: the server reads it
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    try:
        subprocess.run([*as_user, _binary("initdb"), "-D", str(data), "-U", "search", "-A", "trust", "--no-sync"],
                       check=True, capture_output=True)
        subprocess.run([*as_user, _binary("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "start",
                        "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"],
                       check=True, capture_output=True)
        try:
            subprocess.run([*as_user, _binary("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "search",
                            "search"], check=True, capture_output=True)
            yield f"postgresql://search@127.0.0.1:{port}/search"
        finally:
            subprocess.run([*as_user, _binary("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                           capture_output=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
