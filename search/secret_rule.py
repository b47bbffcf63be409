"""The one advice for a secret's value found where values are written down.

A name holds a credential when `search.profile.is_secret` says so (HF_TOKEN, OPENAI_API_KEY,
``--api-key``, DB_PASSWORD). Its value never goes into a file or a command that `search` keeps or
shows: not a space file, not a launch command given to ``--start-from`` or ``space check
--command``, not ``hosts.yaml``. It is exported on the controller and named in the space's
``launch.secret_env``; each trial hands it to the server (over SSH on stdin) without writing it.
Every place that meets one says the same thing, so the user is never told to write it elsewhere.
"""

from __future__ import annotations

from search.space import is_flag

SECRET_VALUE = "a secret's value is written here"


def secret_advice(name: str) -> str:
    """What to do instead of writing ``name``'s value."""
    if is_flag(name):
        return (f"leave {name} out: pass the credential to SGLang through an env var exported in your shell "
                "and listed in the space's launch.secret_env")
    return f"export {name} in your shell and list it in the space's launch.secret_env; it is never written"
