"""The hosts file (``hosts.yaml``): where remote GPU machines are and how to reach them.

One entry per machine. Nothing secret lives here: authentication is a key file or the SSH
agent, never a password, and the host key is checked against a known_hosts file.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from search.errors import BadInput
from search.profile import is_secret
from search.secret_rule import SECRET_VALUE, secret_advice
from search.yaml_keys import duplicate_keys


def _split_command(value: Any) -> Any:
    # `nvidia_smi: python3 -m search.emulator.nvidia_smi` reads as the shell would split it.
    return shlex.split(value) if isinstance(value, str) else value


Command = Annotated[list[str], BeforeValidator(_split_command), Field(min_length=1)]


class HostConfig(BaseModel):
    """One SSH target.

    ``python`` is the interpreter that has SGLang installed there: it launches the server and
    builds the flag manifest live. ``env`` is set for every remote command (e.g. an emulated
    host's ``SEARCH_EMULATOR_STATE_DIR``), so ``nvidia_smi`` and the server see the same state.
    ``nvidia_smi: null`` turns the GPU checks off (a machine without NVIDIA GPUs): only then may
    the GPUs' state be unknown; a command that fails is an error, never a GPU taken as free.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    address: str = Field(min_length=1)
    port: int = Field(22, ge=1, le=65535)
    user: str = Field(min_length=1)
    key_file: Path | None = None  # None: keys from the SSH agent
    known_hosts: Path = Path("~/.ssh/known_hosts")
    python: str = "python3"
    work_dir: str = "search-work"  # relative paths are under the remote user's home
    gpus: list[int] | None = None  # shared out among trials side by side; None: one trial at a time on what it asks for
    server_port: int | None = Field(None, ge=1, le=65535)  # None: the space's launch.port
    nvidia_smi: Command | None = ["nvidia-smi"]  # None: no GPU checks and no telemetry there
    env: dict[str, str] = {}
    emulate: bool = False  # run `python -m search.emulator` with the profile's flags instead of SGLang
    connect_timeout: float = Field(10.0, gt=0)
    reconnect_attempts: int = Field(5, ge=1)  # before the host is marked unavailable
    reconnect_delay: float = Field(2.0, ge=0)  # seconds, doubled after each failed attempt

    @field_validator("key_file", "known_hosts")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        if secret := next(filter(is_secret, env), None):
            raise ValueError(f"{secret}: {SECRET_VALUE}; {secret_advice(secret)}")
        return env

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or len(set(value)) != len(value) or min(value) < 0):
            raise ValueError("gpus must be distinct GPU indexes (0, 1, ...), or left out")
        return value

    @property
    def target(self) -> str:
        """How messages name the host: ``name (user@address:port)``."""
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


class HostsFile(BaseModel):
    """The whole file: ``hosts:`` followed by a list of :class:`HostConfig`."""

    model_config = ConfigDict(extra="forbid")

    hosts: list[HostConfig] = Field(min_length=1)

    @field_validator("hosts")
    @classmethod
    def _unique(cls, hosts: list[HostConfig]) -> list[HostConfig]:
        names = [h.name for h in hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"host names must be unique; repeated: {', '.join(duplicates)}")
        return hosts

    def get(self, name: str) -> HostConfig:
        """The host called ``name``; BadInput listing the known names otherwise."""
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise BadInput(f"no host named {name!r} in the hosts file; known hosts: {known}")


def load_hosts(path: Path) -> HostsFile:
    """Read and validate ``hosts.yaml``; every problem is one BadInput line naming the file and field."""
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except OSError as exc:
        raise BadInput(f"cannot read hosts file {path}: {exc.strerror}; pass --hosts PATH") from exc
    except yaml.YAMLError as exc:
        raise BadInput(f"hosts file {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if twice := duplicate_keys(text):
        raise BadInput(f"hosts file {path}: {twice[0]}")
    try:
        return HostsFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise BadInput(f"hosts file {path}: {where}: {first['msg']}") from exc
