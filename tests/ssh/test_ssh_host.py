"""SSHHost against a real sshd on loopback: host keys, quoting, a remote emulator, dropped connections."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from search.errors import BadInput, InfrastructureFault
from search.hosts.base import MARKER_ENV, Host, ServerHandle
from search.hosts.ssh import SSHHost, command_line


if TYPE_CHECKING:
    from conftest import Sshd

READY = "The server is fired up and ready to roll!"
HOSTILE = ["a b", "it's", 'say "hi"', "x; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "*", "~", "a\\b", "$HOME", "", "\n"]


@dataclass
class Profile:
    """The LaunchProfile fields a host reads (search.profile's contract in docs/architecture.md)."""

    args: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    secret_env: list[str] = field(default_factory=list)
    launcher: list[str] = field(default_factory=lambda: ["python3", "-m", "sglang.launch_server"])
    host: str = "127.0.0.1"

    @property
    def argv(self) -> list[str]:
        return [*self.launcher, *self.args]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def emulated(sshd: Sshd, tmp_path: Path) -> SSHHost:
    """The loopback host running the emulator, with its own GPU state dir."""
    config = sshd.host(
        emulate=True,
        env={"SEARCH_EMULATOR_STATE_DIR": str(tmp_path / "gpus"), "SEARCH_EMULATOR_TIME_SCALE": "0.005",
             "SEARCH_EMULATOR_GPUS": "4"},
        nvidia_smi=f"{sys.executable} -m search.emulator.nvidia_smi",
    )
    host = SSHHost(config)
    yield host
    host.close()


def _profile() -> Profile:
    return Profile(args=["--model-path", "m", "--tp-size", "4", "--host", "127.0.0.1", "--port", str(port := _free_port())], port=port)


def _follow_until(handle: ServerHandle, text: str, timeout: float = 60) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline, f"no {text!r} in {len(lines)} lines: {lines[-5:]}"
        lines += handle.new_lines(timeout=1.0)
    return lines


def _marked(marker: str) -> list[int]:
    """Local pids carrying the marker (the remote is this machine)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_arguments_and_environment_arrive_literally(sshd: Sshd, tmp_path: Path) -> None:
    work = tmp_path / "work dir; $(touch PWNED) 'q'"
    host = SSHHost(sshd.host(work_dir=str(work)))
    assert host.work_dir() == str(work) and work.is_dir()
    echo = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['V']]))"
    value = "$(touch PWNED); 'q' \"`touch PWNED`\" \\"
    status, out, err = host.execute([sys.executable, "-c", echo, *HOSTILE], env={"V": value})
    assert (status, err) == (0, "")
    assert json.loads(out) == [HOSTILE, value]
    assert not list(Path.home().glob("PWNED")) and not list(tmp_path.rglob("PWNED"))
    with pytest.raises(BadInput, match="environment variable name 'A;B'"):
        command_line(["true"], {"A;B": "1"})
    host.close()
