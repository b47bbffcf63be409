"""Look at a page the way a person would: headless Chromium over the DevTools protocol.

`view(path)` opens a local file in Debian's Chromium, waits for it to load, collects every console
error and uncaught exception, asks each plotly chart what it drew, and takes a full-page
screenshot. Only loopback is used; Chromium's background networking is off.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-unsafe-swiftshader", "--remote-debugging-port=0", "--window-size=1400,1000")
WIDTH = 1400

# What every chart drew, read from plotly's own state and from the rendered DOM: its traces, the
# lines laid over it (SLOs, the power limit) and their labels.
_CHARTS_JS = """
Array.from(document.querySelectorAll('[data-chart]')).map(box => {
  const gd = box.querySelector('.js-plotly-plot');
  const data = gd && gd._fullData ? gd._fullData : [];
  const count = t => {
    if (t.type === 'parcoords') return (t.dimensions || []).length ? t.dimensions[0].values.length : 0;
    if (t.type === 'heatmap') return (t.z || []).flat().length;
    return Math.max((t.x || []).length, (t.y || []).length);
  };
  const layout = gd && gd._fullLayout ? gd._fullLayout : {};
  return {key: box.dataset.chart, traces: data.length, points: data.map(count).reduce((a, b) => a + b, 0),
          types: data.map(t => t.type),
          lines: (layout.shapes || []).map(s => ({y: s.y0, yref: s.yref, dash: (s.line || {}).dash})),
          labels: (layout.annotations || []).map(a => a.text),
          drawn: gd ? gd.querySelectorAll('.main-svg, canvas').length : 0,
          height: gd ? gd.getBoundingClientRect().height : 0};
})
"""


@dataclass
class PageView:
    """What the page did: console errors, what each chart drew, sections without data, its text."""

    errors: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for beyond itself
    text: str = ""


def view(page: Path, screenshot: Path, timeout: float = 60.0) -> PageView:
    """Load ``page`` in headless Chromium; screenshot the whole page into ``screenshot``."""
    with tempfile.TemporaryDirectory() as profile:
        # Its own session, so the renderer and helper processes end with it: a helper still
        # writing into the profile made the directory's removal fail ("Directory not empty").
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            ws_url = _devtools_url(proc, timeout)
            return asyncio.run(_drive(ws_url, page, screenshot, timeout))
        finally:
            _end_group(proc)


def _end_group(proc: subprocess.Popen[str]) -> None:
    """Stop Chromium and every process it started; return once none is left."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _devtools_url(proc: subprocess.Popen[str], timeout: float) -> str:
    end = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            browser_ws = found.group(1)
            port = re.search(r":(\d+)/", browser_ws).group(1)  # type: ignore[union-attr]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                targets = json.load(answer)
            return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
    raise RuntimeError(f"chromium did not start (exit {proc.poll()})")


async def _drive(ws_url: str, page: Path, screenshot: Path, timeout: float) -> PageView:
    result = PageView()
    page_url = page.resolve().as_uri()
    async with websockets.connect(ws_url, max_size=None) as ws:
        ids = iter(range(1, 10_000))
        pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        loaded = asyncio.Event()

        async def reader() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in pending:
                    pending.pop(msg["id"]).set_result(msg)
                elif msg.get("method") == "Page.loadEventFired":
                    loaded.set()
                elif msg.get("method") == "Network.requestWillBeSent":
                    url = msg["params"]["request"]["url"]
                    if url != page_url and not url.startswith("data:"):
                        result.requests.append(url)
                elif msg.get("method") == "Runtime.exceptionThrown":
                    details = msg["params"]["exceptionDetails"]
                    result.errors.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
                elif msg.get("method") == "Runtime.consoleAPICalled" and msg["params"]["type"] in ("error", "assert"):
                    result.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                                for a in msg["params"]["args"]))
                elif msg.get("method") == "Log.entryAdded" and msg["params"]["entry"]["level"] == "error":
                    result.errors.append(f"log: {msg['params']['entry']['text']}")

        async def call(method: str, **params: Any) -> dict[str, Any]:
            n = next(ids)
            pending[n] = asyncio.get_running_loop().create_future()
            await ws.send(json.dumps({"id": n, "method": method, "params": params}))
            answer = await asyncio.wait_for(pending[n], timeout)
            if "error" in answer:
                raise RuntimeError(f"{method}: {answer['error']}")
            return answer.get("result", {})

        async def evaluate(expression: str) -> Any:
            answer = await call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
            return answer["result"].get("value")

        task = asyncio.create_task(reader())
        for domain in ("Page", "Runtime", "Log", "Network"):
            await call(f"{domain}.enable")
        await call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=1000, deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", url=page_url)
        await asyncio.wait_for(loaded.wait(), timeout)
        await evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 500)))")  # plotly's async draws
        result.charts = await evaluate(_CHARTS_JS)
        result.missing = await evaluate("Array.from(document.querySelectorAll('[data-missing]')).map(e => e.dataset.missing)")
        result.text = await evaluate("document.body.innerText")
        height = await evaluate("document.documentElement.scrollHeight")
        shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1})
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        task.cancel()
    return result
