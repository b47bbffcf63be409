"""Words and comments that stay on their line, whatever the values they carry.

A launch profile is written as lines: a shell script, and an SGLang ``--config`` YAML whose header
comment holds the launch command. A value with a line break (``NCCL_DEBUG="WARN\\ndisable-radix-cache:
true\\n#"`` in ``launch.env``) would end that comment and inject keys into the YAML, or commands into
the script. So every word is quoted onto one line, control characters escaped, as bash reads them
back: ``$'WARN\\ndisable-radix-cache: true\\n#'``.
"""

from __future__ import annotations

import re
import shlex

# What ends or garbles a line: C0 and C1 controls (YAML also breaks lines at NEL, U+0085) and the
# Unicode line and paragraph separators, which YAML 1.1 treats as line breaks as well.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": r"\n", "\t": r"\t", "\r": r"\r"}


def _escape(char: str) -> str:
    """``\\n``, or the character's UTF-8 bytes as ``\\xHH`` (what bash's ``$'...'`` gives back in any locale)."""
    return _NAMED.get(char) or "".join(f"\\x{byte:02x}" for byte in char.encode())


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x1b``), for a comment or a message."""
    return _UNSAFE.sub(lambda m: _escape(m.group()), text)


def shell_word(text: str) -> str:
    """``text`` as one bash word on one line: ``shlex.quote``, or ``$'...'`` when it holds control characters."""
    if not _UNSAFE.search(text):
        return shlex.quote(text)
    body = text.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + one_line(body) + "'"
