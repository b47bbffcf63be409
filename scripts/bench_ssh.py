"""What the SSH host costs per operation, against a real sshd on loopback (run as root).

    python scripts/bench_ssh.py [--rounds 20]

Prints the median and worst seconds of: a remote command round trip, one GPU telemetry sample
(the emulator's nvidia-smi stand-in; must stay well under the 1 s sampling period), one log poll
with nothing new, a reconnect after the connection is cut, and starting the emulator to ready.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from socket import socket

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "ssh"))
from conftest import start_sshd  # noqa: E402 - the test suite's real-sshd fixture

from search.hosts.ssh import SSHHost  # noqa: E402
from search.profile import LaunchProfile  # noqa: E402


def timed(action: Callable[[], object], rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        sshd = start_sshd(Path(tmp) / "sshd")
        try:
            state = Path(tmp) / "gpus"
            host = SSHHost(sshd.host(emulate=True, nvidia_smi=f"{sys.executable} -m search.emulator.nvidia_smi",
                                     env={"SEARCH_EMULATOR_STATE_DIR": str(state), "SEARCH_EMULATOR_TIME_SCALE": "0.005"}))
            host.run(["true"])
            report = {"command round trip": timed(lambda: host.run(["true"]), rounds),
                      "GPU telemetry sample": timed(host.gpu_samples, rounds)}

            def reconnect() -> None:
                sshd.cut_sessions()
                host.run(["true"])

            report["reconnect after a cut"] = timed(reconnect, max(3, rounds // 4))
            with socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            profile = LaunchProfile(launcher=["python3", "-m", "sglang.launch_server"], env={}, secret_env=[],
                                    args=["--model-path", "m", "--tp-size", "4", "--port", str(port)],
                                    host="127.0.0.1", port=port, sglang_version="0.5.23")
            start = time.perf_counter()
            handle = host.start(profile, marker="bench", log_path=Path(tmp) / "server.log")
            while not any("ready to roll" in line for line in handle.new_lines(1.0)):
                pass
            ready = time.perf_counter() - start
            report["log poll, nothing new"] = timed(lambda: handle.new_lines(0), rounds)
            start = time.perf_counter()
            handle.stop(grace=5)
            report["stop and verify clean"] = (time.perf_counter() - start,) * 2
            report["emulator start to ready (scale 0.005)"] = (ready, ready)
            host.close()
        finally:
            sshd.stop()
    for name, (median, worst) in report.items():
        print(f"{name:40s} median {median * 1000:8.1f} ms   worst {worst * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
