"""Load a page in headless Chromium over the DevTools protocol (a pipe, no extra packages):
network blocked, every request attempt, console message and error recorded, a screenshot."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PageLoad:
    requests: list[str] = field(default_factory=list)  # URLs the page tried to fetch
    console: list[str] = field(default_factory=list)  # console messages, log entries and exceptions
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self.proc, self.w, self.r = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(method)
            self.events.append(self._read())

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self.buf:
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("the browser closed the pipe")
            self.buf += chunk
        raw, _, self.buf = self.buf.partition(b"\0")
        return dict(json.loads(raw))


@contextmanager
def browser(chromium: str = "chromium") -> Iterator[tuple[_Pipe, str]]:
    """Headless Chromium on a DevTools pipe, with one blank page attached: ``(pipe, session)``.
    Killed on the way out."""
    to_r, to_w = os.pipe()  # browser reads fd 3
    from_r, from_w = os.pipe()  # browser writes fd 4

    def pipes_as_fds_3_and_4() -> None:
        high_r = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", f"--user-data-dir={profile}", "--window-size=1100,1400", "about:blank"],
            pass_fds=(3, 4, to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=pipes_as_fds_3_and_4, start_new_session=True,
        )
        os.close(to_r)
        os.close(from_w)
        cdp = _Pipe(proc, to_w, from_r)
        try:
            target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            yield cdp, session
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            os.close(to_w)
            os.close(from_r)


def offline(cdp: _Pipe, session: str) -> None:
    """Cut the page's network off."""
    cdp.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": 0,
                                                  "uploadThroughput": 0}, session=session)


def load(page: Path, chromium: str = "chromium") -> PageLoad:
    """Open ``page`` (a local file) with every network request blocked."""
    with browser(chromium) as (cdp, session):
        for domain in ("Page", "Network", "Runtime", "Log"):
            cdp.send(f"{domain}.enable", session=session)
        offline(cdp, session)
        cdp.send("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*"]},
                 session=session)
        cdp.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        cdp.wait_for("Page.loadEventFired")
        time.sleep(0.5)  # late console messages
        shot = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                        session=session)
    result = PageLoad(screenshot=base64.b64decode(shot["data"]))
    document = page.resolve().as_uri()
    for e in cdp.events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if url != document and not url.startswith("data:"):
                result.requests.append(url)
        elif method == "Runtime.consoleAPICalled":
            result.console.append(f"console.{params.get('type')}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            result.console.append(f"exception: {params.get('exceptionDetails')}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            result.console.append(f"{entry.get('level')}: {entry.get('text')}")
    return result
