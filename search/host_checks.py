"""What `search host check` verifies beyond connecting: SFTP, and which SGLang the host runs.

A trial's log and results come back over SFTP; an sshd without the SFTP subsystem let the check
pass and then failed every trial as an infrastructure fault (``SSHException ... Channel closed.``)
until the study stopped. And a host with ``emulate: true`` runs `search.emulator`, not SGLang: its
flags are the emulated version's, whether or not that host's Python has SGLang installed.
"""

from __future__ import annotations

import paramiko

from search import manifests
from search.emulator.config import Settings
from search.errors import RunFailed
from search.hosts.ssh import SSHHost


def check_sftp(host: SSHHost) -> None:
    """RunFailed saying how to enable SFTP when the host's sshd does not offer it."""
    try:
        host.sftp()
    except paramiko.SSHException as exc:
        raise RunFailed(f"host {host.name}: no SFTP session ({exc}); search copies each trial's log and results "
                        "back over SFTP: add `Subsystem sftp internal-sftp` to the host's sshd_config and reload "
                        "sshd") from None


def host_manifest(host: SSHHost) -> tuple[manifests.Manifest, str]:
    """The flags the host's servers take, and where they come from (for the check's report)."""
    python = host.config.python
    if not host.config.emulate:
        return manifests.live(python, run=host.run), python
    host.run([python, "-c", "import search.emulator"])  # RunFailed quoting the ImportError
    version = Settings.from_env(dict(host.config.env)).version
    return manifests.load(version), f"emulated by search.emulator on {python}"
