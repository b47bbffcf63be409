"""Teardown and host cleanliness: group, grace, SIGKILL, the marker sweep, the bounded wait."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from search.errors import InfrastructureFault
from search.hosts import LocalHost
from search.hosts.emulated import EmulatedHost
from search.lifecycle import start_server

# A server that ignores SIGTERM and leaves behind a child in its own session (out of the group),
# which ignores SIGTERM too; it listens on its port and writes the child's pid.
STUBBORN = '''
import os, signal, socket, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
port, pidfile = int(sys.argv[1]), sys.argv[2]
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
open(pidfile, "w").write(str(child.pid))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port)); s.listen()
print("listening", flush=True)
time.sleep(600)
'''


# A server whose child leaves the process group (its own session) but exits cleanly on SIGTERM,
# noting in argv[2] that it got one; it writes its pid to argv[3].
COOPERATIVE_ESCAPEE = '''
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "def done(*_):\\n"
    "    open(sys.argv[1], 'w').write('SIGTERM')\\n"
    "    sys.exit(0)\\n"
    "signal.signal(signal.SIGTERM, done)\\n"
    "print('child ready', flush=True)\\n"
    "time.sleep(600)\\n", sys.argv[2]], start_new_session=True)
open(sys.argv[3], "w").write(str(child.pid))
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def bystander():
    """A process we did not start as a trial: teardown must never touch it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def test_orphaned_ranks_of_a_sigkilled_parent_are_found_by_marker(make_profile, marker, tmp_path, bystander):
    host, profile = EmulatedHost(), make_profile("ok")
    handle, startup = start_server(host, profile, marker=marker, log_path=tmp_path / "server.log", timeouts={})
    assert startup.ok
    os.kill(handle.pid, signal.SIGKILL)  # the parent dies as in a crash; its ranks live on
    while handle.returncode() is None:
        time.sleep(0.01)
    held = host.held(profile)
    assert any(h.startswith("GPU 0 by pid") for h in held) and any(h.startswith("GPU 1 by pid") for h in held)

    # A dirty host is reported after the bounded wait, naming what is held and by whom.
    began = time.monotonic()
    with pytest.raises(InfrastructureFault, match=r"not clean after 0\.5 s: GPU 0 by pid \d+ \(.*search\.emulator"):
        host.ensure_clean(profile, timeout=0.5)
    assert 0.5 <= time.monotonic() - began < 3

    # A driver that died mid-trial comes back and kills the leftovers by marker alone.
    assert EmulatedHost().kill_marker(marker) >= 2
    host.ensure_clean(profile, timeout=2)
    assert host.kill_marker(marker) == 0
    handle.stop()  # nothing left to do, and it says so by not raising
    assert _alive(bystander.pid)


def test_stop_after_parent_killed_sweeps_the_orphans(make_profile, marker, tmp_path, bystander):
    host, profile = EmulatedHost(), make_profile("ok", tp=3)
    handle, startup = start_server(host, profile, marker=marker, log_path=tmp_path / "server.log", timeouts={})
    assert startup.ok
    os.kill(handle.pid, signal.SIGKILL)
    handle.stop(grace=5)
    assert host.held(profile) == []
    assert host.kill_marker(marker) == 0
    assert _alive(bystander.pid)


def test_server_ignoring_sigterm_and_escaped_child_are_killed_after_grace(script_profile, tmp_path, marker, bystander):
    pidfile = tmp_path / "child.pid"
    profile = script_profile(STUBBORN, str(pidfile))
    port = profile.port
    host = LocalHost()
    handle = host.start(profile, marker=marker, log_path=tmp_path / "server.log")
    deadline = time.monotonic() + 10
    while "listening" not in handle.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert os.getpgid(child) != os.getpgid(handle.pid)  # it escaped the group
    [held] = host.held(profile)
    assert held.startswith(f"port {port} by pid {handle.pid} ({sys.executable} ")

    began = time.monotonic()
    handle.stop(grace=0.5)
    took = time.monotonic() - began
    assert 0.5 <= took < 0.5 + 3  # grace, then SIGKILL at once (the benchmark measures it tightly)
    assert handle.returncode() == -signal.SIGKILL
    assert not _alive(child)
    assert host.held(profile) == []
    assert _alive(bystander.pid)


def test_escaped_child_gets_sigterm_with_the_group(script_profile, tmp_path, marker, bystander):
    """A child that left the group but carries the marker is asked to stop like the group, not
    SIGKILLed after the grace period: it may hold GPU memory it should release cleanly."""
    noted, pidfile = tmp_path / "signal.txt", tmp_path / "child.pid"
    host, profile = LocalHost(), script_profile(COOPERATIVE_ESCAPEE, str(noted), str(pidfile))
    handle = host.start(profile, marker=marker, log_path=tmp_path / "server.log")
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and "child ready" in handle.log_path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert os.getpgid(child) != os.getpgid(handle.pid)  # it escaped the group
    handle.stop(grace=10)
    assert noted.read_text() == "SIGTERM"  # it got SIGTERM, and exited on it before any SIGKILL
    assert not _alive(child)
    assert host.kill_marker(marker) == 0
    assert _alive(bystander.pid)


def test_ensure_clean_names_the_process_holding_the_port(make_profile):
    profile = make_profile("ok")
    with socket.socket() as s:
        s.bind(("127.0.0.1", profile.port))
        s.listen()
        with pytest.raises(InfrastructureFault, match=rf"port {profile.port} by pid {os.getpid()} "):
            EmulatedHost().ensure_clean(profile, timeout=0.2)
    EmulatedHost().ensure_clean(profile, timeout=0.2)
