"""Writing a file the user named (`-o`): a path that cannot be written is their input, not our bug."""

from __future__ import annotations

from pathlib import Path

from search.errors import BadInput


def write_output(path: Path, text: str, *, executable: bool = False) -> Path:
    """Write ``text`` to ``path`` (parent directories created; mode 755 if ``executable``).

    An OSError (the parent is a file, no permission, a read-only disk) is BadInput naming the
    path, so the CLI prints one line and exits 2 instead of reporting a bug.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if executable:
            path.chmod(0o755)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}; give -o a file in a directory you can "
                       "write to") from None
    return path
