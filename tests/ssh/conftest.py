"""A real OpenSSH server on a free loopback port, started by the test session and torn down after.

Host and user keys are generated per session; the server has its own sshd_config (keys only,
loopback only, its own authorized_keys), so nothing of the machine's SSH setup is read or
changed except the privilege-separation directory sshd insists on. Runs as root (CI is root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from search.hosts.config import HostConfig
from tests.helpers import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"



def _descendants(pid: int) -> list[int]:
    """Children of ``pid``, recursively, deepest first (read from /proc; no names involved)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            found.extend(_descendants(child))
            found.append(child)
    return found


def _exe(pid: int) -> str | None:
    try:
        return os.path.realpath(f"/proc/{pid}/exe", strict=True)
    except OSError:
        return None


@dataclass
class Sshd:
    """The running server and everything a client needs to reach it."""

    dir: Path
    port: int
    user_key: Path
    known_hosts: Path  # holds the server's key
    host_key_line: str
    process: subprocess.Popen[bytes] | None = None
    settings: str = ""  # sshd_config lines in place of the default "MaxSessions 64"

    def start(self) -> None:
        """Start (or restart, same port and keys) and wait until it speaks SSH."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "sshd.log", "ab"),  # noqa: SIM115 - the child owns it
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not answer within 10 s")

    def restart(self, settings: str = "") -> None:
        """Restart (cutting every session) with ``settings`` (see :func:`start_sshd`)."""
        self.stop()
        self.configure(settings)
        self.start()

    def configure(self, settings: str = "") -> None:
        """Write sshd_config: keys only, loopback only, this server's files, then ``settings``."""
        root = self.dir
        self.settings = settings
        (root / "sshd_config").write_text(
            f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {root / 'host_key'}
PidFile {root / 'sshd.pid'}
AuthorizedKeysFile {root / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
MaxStartups 64
LogLevel ERROR
{settings or "MaxSessions 64"}
"""
        )

    def stop(self) -> None:
        """Stop the listener and every session it serves (by pid: only what this fixture started).

        A client reconnecting right after the cut must not get a session on the old settings that
        outlives the listener. So the listener is paused (it forks nothing more), its sessions are
        cut while they are still its children, and it is killed without running again: resumed to
        see a SIGTERM, it could still accept a connection waiting in its backlog first.
        """
        if self.process is None:
            return
        self.process.send_signal(signal.SIGSTOP)
        self.cut_sessions()
        self.process.kill()  # the waiting connections are reset
        self.process.wait(10)
        self.process = None

    def cut_sessions(self) -> int:
        """Kill the sshd processes serving open connections, as a dropped network would.

        Only sshd's own processes: the remote commands they ran are left to finish, as after a
        real drop (killing them too could leave their side effects half done, e.g. a lock file
        of the login shell's startup scripts that stalls every later command).
        """
        assert self.process is not None
        pids = [pid for pid in _descendants(self.process.pid) if _exe(pid) == os.path.realpath(SSHD)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def host(self, name: str = "loop", known_hosts: Path | None = None, **fields: object) -> HostConfig:
        """A hosts.yaml entry for this server; the remote Python is this interpreter.

        GPU checks are off (``nvidia_smi: null``: this machine has no nvidia-smi) unless a test
        names a command, such as the emulator's stand-in.
        """
        values: dict[str, object] = {
            "name": name,
            "address": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "key_file": self.user_key,
            "known_hosts": known_hosts or self.known_hosts,
            "python": sys.executable,
            "work_dir": str(self.dir / "work"),
            "connect_timeout": 5,
            "reconnect_attempts": 3,
            "reconnect_delay": 0.2,
            "nvidia_smi": None,
        }
        values.update(fields)
        return HostConfig.model_validate(values)


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "search-test", "-f", str(path)], check=True)


def start_sshd(root: Path, settings: str = "") -> Sshd:
    """Generate keys and config under ``root`` and start sshd on a free loopback port (root only).

    ``settings``: sshd_config lines replacing ``MaxSessions 64`` (e.g. ``MaxSessions 0``: logins
    succeed, every command and SFTP session is refused, as on a host whose sshd is failing).
    """
    if os.geteuid() != 0 or not Path(SSHD).exists():
        raise RuntimeError("a test sshd needs root and OpenSSH's sshd (apt-get install -y openssh-server)")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    _keygen(root / "host_key")
    _keygen(root / "user_key")
    shutil.copy(root / "user_key.pub", root / "authorized_keys")
    port = free_port()
    host_key = (root / "host_key.pub").read_text().split()
    line = f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}"
    (root / "known_hosts").write_text(line + "\n")
    server = Sshd(dir=root, port=port, user_key=root / "user_key", known_hosts=root / "known_hosts", host_key_line=line)
    server.configure(settings)
    server.start()
    return server


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    try:
        server = start_sshd(tmp_path_factory.mktemp("sshd"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def live_sshd(sshd: Sshd) -> Iterator[Sshd]:
    """The session's server, restarted as it was after the test if the test stopped or reconfigured it."""
    yield sshd
    if sshd.process is None or sshd.settings:
        sshd.restart()
