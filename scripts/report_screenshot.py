"""Regenerate the README's report screenshot, docs/report.png, from a short demo study on the emulator.

What scripts/demo.sh does, smaller: `search study run spaces/demo.yaml --emulate` (the SGLang
emulator and its nvidia-smi, no GPU) for a few trials with one re-measurement each of the top 3,
one of them a launch command that crashes, then `search study report`. The page is loaded in headless Chromium the way tests/report looks at
it (tests/report/browser.py) and its full-page screenshot kept. It stops with an error, keeping
no screenshot, if the page logged an error or a chart had nothing to draw.

The demo space is copied with a free port, and the emulator's GPUs live in the work directory, so
the run does not collide with another study on this machine.

    python scripts/report_screenshot.py                    # docs/report.png (about 5 min on 2 cores)
    python scripts/report_screenshot.py --trials 12 --keep /tmp/demo --out /tmp/report.png
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.report.browser import view  # noqa: E402 - the report tests' Chromium driver

STUDY = "demo"
# A launch command tried early, as `--start-from` tries yours: the baseline with the memory fraction
# at the top of its range, which leaves CUDA graph capture too little memory, so the outcome map
# has a crash, its phase and its log line to show however the search itself goes.
CRASHES = ("python -m sglang.launch_server --model-path lukealonso/GLM-5-NVFP4 --tp 8 --max-running-requests 64 "
           "--cuda-graph-backend-decode full --cuda-graph-max-bs-decode 256 --moe-runner-backend flashinfer_cutlass "
           "--disable-flashinfer-autotune --mem-fraction-static 0.94")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_space(work: Path) -> Path:
    """spaces/demo.yaml on a port nobody else uses."""
    data = yaml.safe_load((ROOT / "spaces" / "demo.yaml").read_text())
    data["launch"]["port"] = _free_port()
    path = work / "demo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def search(work: Path, *args: str) -> None:
    """The `search` CLI of this checkout, in ``work``, with the emulator's GPU state kept there."""
    env = {**os.environ, "SEARCH_EMULATOR_STATE_DIR": str(work / "state"), "SEARCH_EMULATOR_TIME_SCALE": "0.01",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    subprocess.run([sys.executable, "-c", "from search.cli import main; main()", *args], cwd=work, env=env,
                   check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="measured trials in the demo study (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    parser.add_argument("--keep", type=Path, help="work directory to keep (studies.db, trials/, report.html)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="search-report-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    # The default storage, studies.db in the work directory: the page's export command reads as a user's would.
    search(work, "study", "run", str(demo_space(work)), "--study", STUDY, "--emulate", "--n-trials", str(args.trials),
           "--remeasure", "1", "--seed", str(args.seed), "--start-from", CRASHES)
    search(work, "study", "report", STUDY, "-o", "report.html")
    shot = work / "report.png"
    seen = view(work / "report.html", shot)
    if seen.errors or seen.missing:
        sys.exit(f"the report is not fit to show (kept in {work}): errors {seen.errors}, charts without data "
                 f"{seen.missing}; try another --seed or more --trials")
    args.out.write_bytes(shot.read_bytes())
    print(f"{args.out} from {work / 'report.html'}")


if __name__ == "__main__":
    main()
