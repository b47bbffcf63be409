"""SSHHost against a real sshd on loopback: host keys, quoting, a remote emulator, dropped connections."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
import pytest

from search import gpu
from search.errors import BadInput, InfrastructureFault
from search.hosts.base import MARKER_ENV, Host, ServerHandle
from search.hosts.ssh import SSHHost, command_line
from search.profile import LaunchProfile
from tests.helpers import free_port

if TYPE_CHECKING:
    from conftest import Sshd

READY = "The server is fired up and ready to roll!"
HOSTILE = ["a b", "it's", 'say "hi"', "x; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "*", "~", "a\\b", "$HOME", "", "\n"]


def Profile(  # noqa: N802 - reads like the dataclass it builds
    args: list[str], port: int, env: dict[str, str] | None = None, secret_env: list[str] | None = None,
            launcher: list[str] | None = None) -> LaunchProfile:
    return LaunchProfile(launcher=launcher or ["python3", "-m", "sglang.launch_server"], args=args, env=env or {},
                         secret_env=secret_env or [], host="127.0.0.1", port=port, sglang_version="0.5.23")



@pytest.fixture
def emulated(sshd: Sshd, tmp_path: Path) -> Iterator[SSHHost]:
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
    return Profile(args=["--model-path", "m", "--tp-size", "4", "--host", "127.0.0.1", "--port", str(port := free_port())], port=port)


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


def test_unknown_host_key_is_refused_then_recorded_once_with_the_flag(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    with pytest.raises(BadInput, match=r"host loop: unknown host key for \[127\.0\.0\.1\]:\d+ .*--accept-new-host-key"):
        SSHHost(sshd.host(known_hosts=known)).run(["true"])
    assert not known.exists()
    accepting = SSHHost(sshd.host(known_hosts=known), accept_new_host_key=True)
    assert accepting.run(["echo", "hi"]) == "hi\n"
    accepting.close()
    assert known.read_text() == sshd.host_key_line + "\n"
    plain = SSHHost(sshd.host(known_hosts=known))  # recorded: no flag needed any more
    assert plain.run(["echo", "again"]) == "again\n"
    plain.close()


def test_changed_host_key_is_refused_even_with_the_flag(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIGJ2b3JkZW5zdGVpbmdlc3RlaW5ncmFuZG9ta2V5MDAx"
    known.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 {other}\n")
    with pytest.raises(BadInput, match=r"host key of \[127\.0\.0\.1\]:\d+ CHANGED .*ssh-keygen -R"):
        SSHHost(sshd.host(known_hosts=known), accept_new_host_key=True).run(["true"])
    assert known.read_text().count("\n") == 1


def test_emulator_started_remotely_is_followed_and_stopped_without_leftovers(emulated: SSHHost, tmp_path: Path) -> None:
    assert isinstance(emulated, Host)
    profile = _profile()
    emulated.ensure_clean(profile, timeout=5)
    handle = emulated.start(profile, marker="trial-1", log_path=tmp_path / "trial" / "server.log")
    assert isinstance(handle, ServerHandle)
    try:
        lines = _follow_until(handle, READY)
        assert handle.returncode() is None
        assert _marked("trial-1")  # the ranks carry the marker
        samples = emulated.gpu_samples()  # the emulator's nvidia-smi stand-in, over SSH
        assert samples is not None and [s.index for s in samples] == [0, 1, 2, 3]
        assert len(gpu.busy(samples, [0, 1, 2, 3])) == 4  # memory held by the live ranks
        assert emulated.held(profile)[0] == f"port {profile.port} in use"
        with gpu.Telemetry(emulated.gpu_samples, gpus=[0, 1], interval=0.1) as telemetry:
            while telemetry.mark() < 2:
                time.sleep(0.05)
        window = telemetry.since(0)
        assert window is not None and window.power_w and window.power_limit_w and window.power_w <= window.power_limit_w
    finally:
        handle.stop(grace=5)
    assert _marked("trial-1") == []
    emulated.ensure_clean(profile, timeout=1)
    remote_log = Path(emulated.work_dir()) / "trial-1" / "server.log"
    assert (tmp_path / "trial" / "server.log").read_bytes() == remote_log.read_bytes()
    assert remote_log.read_text().startswith("\n".join(lines))
    assert handle.returncode() is not None


def test_kill_marker_sweeps_a_server_left_behind(emulated: SSHHost, tmp_path: Path) -> None:
    profile = _profile()
    handle = emulated.start(profile, marker="trial-2", log_path=tmp_path / "server.log")
    _follow_until(handle, "Load weight begin")
    assert emulated.kill_marker("trial-2") >= 1
    assert _marked("trial-2") == []
    assert emulated.kill_marker("trial-2") == 0
    handle.stop(grace=1)


def test_connection_cut_mid_follow_reconnects_and_loses_no_line(sshd: Sshd, emulated: SSHHost, tmp_path: Path) -> None:
    handle = emulated.start(_profile(), marker="trial-3", log_path=tmp_path / "server.log")
    try:
        lines = _follow_until(handle, "Load weight begin")
        assert sshd.cut_sessions() >= 1
        lines += _follow_until(handle, READY)
    finally:
        handle.stop(grace=5)
    remote = (Path(emulated.work_dir()) / "trial-3" / "server.log").read_text()
    assert remote.startswith("\n".join(lines) + "\n")  # every line once, in order, across the cut
    assert (tmp_path / "server.log").read_text() == remote


def test_trial_state_lost_after_a_drop_is_an_infrastructure_fault(sshd: Sshd, emulated: SSHHost, tmp_path: Path) -> None:
    handle = emulated.start(_profile(), marker="trial-4", log_path=tmp_path / "server.log")
    _follow_until(handle, "Load weight begin")
    sshd.cut_sessions()
    os.killpg(handle.pgid, signal.SIGKILL)  # what a host reboot does to the wrapper and the server
    emulated.kill_marker("trial-4")
    with pytest.raises(InfrastructureFault, match="trial-4 vanished without an exit status; trial state lost"):
        handle.returncode()
    handle.stop(grace=1)


def test_a_host_that_stays_down_is_marked_unavailable(live_sshd: Sshd) -> None:
    host = SSHHost(live_sshd.host(reconnect_attempts=2, reconnect_delay=0.05))
    assert host.run(["true"]) == "" and host.available
    live_sshd.stop()
    with pytest.raises(InfrastructureFault, match=r"host loop \(root@127\.0\.0\.1:\d+\) unreachable after 2 attempts"):
        host.run(["true"])
    assert not host.available and host.last_error
    live_sshd.start()
    assert host.run(["echo", "back"]) == "back\n" and host.available
    host.close()


# A stand-in server: logs its argv and secret, leaves a result file in its working directory.
_ECHO_SERVER = """
import json, os, sys, time
print(json.dumps([sys.argv[1:], os.environ["SEARCH_TEST_SECRET"], os.environ["PLAIN"]]), flush=True)
open("result.json", "w").write("{}")
print("written", flush=True)
time.sleep(60)
"""


def test_profile_values_and_secrets_reach_the_server_literally(sshd: Sshd, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t $(touch PWNED) 'x'"
    monkeypatch.setenv("SEARCH_TEST_SECRET", secret)
    host = SSHHost(sshd.host())
    profile = Profile(args=HOSTILE[:-1], port=free_port(), env={"PLAIN": "a;b"}, secret_env=["SEARCH_TEST_SECRET"],
                      launcher=["python3", "-c", _ECHO_SERVER])
    handle = host.start(profile, marker="trial-5", log_path=tmp_path / "trial" / "server.log")
    try:
        lines = _follow_until(handle, "written")
        assert json.loads(lines[0]) == [HOSTILE[:-1], secret, "a;b"]
        wrapper = Path(f"/proc/{handle.pgid}/cmdline").read_bytes()
        assert b"s3cr3t" not in wrapper and b"PLAIN=a;b" in wrapper  # secrets never on a command line
    finally:
        handle.stop(grace=2)
    assert handle.returncode() == -15
    assert json.loads((tmp_path / "trial" / "result.json").read_text()) == {}  # results copied back
    assert (tmp_path / "trial" / "exit-status").read_text() == "143\n"
    assert not list(tmp_path.rglob("PWNED")) and not list(Path.home().glob("PWNED"))
    host.close()


def test_a_missing_gpu_command_faults_the_trial_at_once(sshd: Sshd) -> None:
    host = SSHHost(sshd.host(nvidia_smi="nvidia-smi-typo"))
    with pytest.raises(InfrastructureFault, match=r"GPU query `nvidia-smi-typo` not found there .*nvidia_smi: null"):
        host.ensure_clean(_profile(), timeout=60)  # not a wait for GPUs that can never be seen
    assert SSHHost(sshd.host(nvidia_smi=None)).gpu_samples() is None  # checks turned off on purpose
    host.close()


def test_every_connection_error_after_the_retry_is_an_infrastructure_fault(tmp_path: Path) -> None:
    from tests.ssh.conftest import start_sshd

    failing = start_sshd(tmp_path / "sshd", "MaxSessions 0")  # logins work, every command and SFTP session is refused
    host = SSHHost(failing.host())
    try:
        for action in (lambda: host.run(["true"]), lambda: host.fetch_dir(str(tmp_path), tmp_path / "copy"),
                       lambda: host.execute(["true"], retry=False)):
            with pytest.raises(InfrastructureFault, match=r"host loop \(root@127\.0\.0\.1:\d+\): ChannelException over SSH"):
                action()
        assert host.available  # it answers: not marked down, the fault is the trial's to retry
    finally:
        host.close()
        failing.stop()


def test_commands_refused_on_several_threads_at_once_each_name_the_refusal(tmp_path: Path) -> None:
    """The trial, its health check and its telemetry share one connection. paramiko keeps the reason
    a channel was refused in one slot per connection, read once: openers racing on it (or one
    dropping the connection under another's open) got a bare "Unable to open channel." instead."""
    from tests.ssh.conftest import start_sshd

    failing = start_sshd(tmp_path / "sshd", "MaxSessions 0")
    host = SSHHost(failing.host())
    messages: list[str] = []

    def refused() -> None:
        for _ in range(5):
            try:
                host.run(["true"])
            except InfrastructureFault as exc:
                messages.append(str(exc))

    threads = [threading.Thread(target=refused) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        host.close()
        failing.stop()
    assert len(messages) == 30
    assert all("ChannelException over SSH (also after reconnecting)" in m for m in messages), set(messages)


# A stand-in server with a result big enough that copying it back takes a while.
_BIG_RESULT_SERVER = """
import os, time
with open("results.bin", "wb") as out:
    out.write(os.urandom(64 << 20))
print("written", flush=True)
time.sleep(60)
"""


# paramiko's SFTP prefetch thread dies with the connection (EOFError, unhandled there); the copy itself
# raises on this thread, which is what the test is about.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_connection_cut_while_stop_copies_the_results_copies_them_again(live_sshd: Sshd, tmp_path: Path) -> None:
    host = SSHHost(live_sshd.host())
    handle = host.start(Profile(args=[], port=free_port(), launcher=["python3", "-c", _BIG_RESULT_SERVER]),
                        marker="trial-8", log_path=tmp_path / "trial" / "server.log")
    copy = tmp_path / "trial" / "results.bin"
    cut_at: list[int] = []
    done = threading.Event()

    def cut_mid_copy() -> None:  # as soon as the copy has begun: the network drops
        while not cut_at and not done.is_set():
            if copy.exists() and copy.stat().st_size:
                cut_at.append(copy.stat().st_size)
                live_sshd.cut_sessions()
            time.sleep(0.001)

    cutter = threading.Thread(target=cut_mid_copy, daemon=True)
    try:
        _follow_until(handle, "written")
        cutter.start()
        handle.stop(grace=2)
    finally:
        done.set()
        host.close()
    remote = Path(host.work_dir()) / "trial-8" / "results.bin"
    assert cut_at and cut_at[0] < remote.stat().st_size  # the cut came mid-copy
    assert copy.read_bytes() == remote.read_bytes()  # copied again, whole
    assert (tmp_path / "trial" / "exit-status").read_text() == "143\n"
    assert _marked("trial-8") == []


def test_a_copy_that_ends_early_is_copied_again(live_sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko's get passes a read that a cut ended early (it checks the bytes it wrote against the
    bytes it read); the fetch must tell by the remote size and copy again. The first transfer is
    made to stop after its first chunk, as a dropped connection does, so this does not hang on timing."""
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "results.bin").write_bytes(os.urandom(1 << 20))
    real = paramiko.SFTPClient._transfer_with_callback
    calls: list[int] = []

    def first_ends_early(self: paramiko.SFTPClient, reader: object, writer: object, file_size: int, callback: object) -> int:
        calls.append(file_size)
        if len(calls) > 1:
            return real(self, reader, writer, file_size, callback)
        data = reader.read(32768)  # type: ignore[attr-defined]
        writer.write(data)  # type: ignore[attr-defined]
        return len(data)

    monkeypatch.setattr(paramiko.SFTPClient, "_transfer_with_callback", first_ends_early)
    host = SSHHost(live_sshd.host())
    try:
        host.fetch_dir(str(tmp_path / "remote"), tmp_path / "copy")
    finally:
        host.close()
    assert len(calls) == 2
    assert (tmp_path / "copy" / "results.bin").read_bytes() == (tmp_path / "remote" / "results.bin").read_bytes()


def test_sftp_reads_from_several_threads_each_get_their_own_reply(sshd: Sshd, tmp_path: Path) -> None:
    # Two trials side by side on one host read their logs over the one SFTP session at once.
    # Unserialized, paramiko handed one thread's reply to the other and the first waited forever.
    host = SSHHost(sshd.host())
    log = tmp_path / "server.log"
    log.write_bytes(b"line\n" * 1000)
    errors: list[str] = []

    def read(sftp: paramiko.SFTPClient) -> bytes:
        size = sftp.stat(str(log)).st_size or 0
        with sftp.open(str(log), "rb") as f:
            f.seek(size - 5)
            return f.read(5)

    def trial() -> None:
        try:
            for _ in range(100):
                assert host.with_sftp(read) == b"line\n"
        except Exception as exc:  # reported by the main thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=trial, daemon=True) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not [t for t in threads if t.is_alive()] and not errors
    finally:
        host.close()
