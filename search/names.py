"""Study names and the trials directory that become paths: ``trials/<study>/<n>/`` and the study's lock file.

A name is a single directory entry, so that a study can never write outside ``trials/``:
``--study /abs/path``, ``--study ../../x`` or ``--study ""`` would otherwise put its trials
anywhere the user can write.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from search.errors import BadInput

MAX_LEN = 200  # bytes; a file name holds 255, and the lock file adds a suffix


def checked_study_name(name: str) -> str:
    """``name`` if it is one safe directory entry; BadInput naming what is wrong otherwise."""
    separators = {"/", os.sep, os.altsep or "/"}
    if not name:
        problem = "is empty"
    elif any(sep in name for sep in separators):
        problem = "holds a path separator"
    elif name.startswith("."):
        problem = "starts with a dot"
    elif any(unicodedata.category(ch).startswith("C") for ch in name):
        problem = "holds a control character"
    elif len(name.encode()) > MAX_LEN:
        problem = f"is longer than {MAX_LEN} bytes"
    else:
        return name
    raise BadInput(f"study name {name!r} {problem}, and it names the directory trials/<study>/: "
                   "use letters, digits, - and _ (e.g. --study glm5-fp4)")


def checked_trials_dir(path: Path) -> Path:
    """``path`` if trial directories can be made under it: its nearest existing part is a writable
    directory. Checked before a study starts, so no measured trial is lost for want of a place to put it."""
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor or "."))
    if not existing.is_dir():
        raise BadInput(f"--trials-dir {path}: {existing} is not a directory; give a directory for trial artifacts")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BadInput(f"--trials-dir {path}: {existing} is not writable; make it writable or give another directory")
    return path
