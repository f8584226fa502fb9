"""A headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``), for page tests.

``open_page(path)`` loads a local HTML file in a fresh profile and returns what a reader would
care about: console errors and exceptions, every network request the page made, and the answers
of JavaScript probes evaluated in the page. Nothing but the standard library: the protocol's
pipe is two file descriptors (3: commands in, 4: events and replies out), messages are JSON
ended by a NUL byte.

``find_chromium()`` is None when no browser is installed: tests skip then, unless
``COSYCLONE_REQUIRE_BROWSER=1`` (set by .ci/run) makes the absence a failure.

Run as a script it writes a screenshot: ``python -m tests.browser PAGE.html OUT.png [WIDTH HEIGHT]``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENV_REQUIRE = "COSYCLONE_REQUIRE_BROWSER"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The browser's path; skips the test without one (fails instead under COSYCLONE_REQUIRE_BROWSER=1)."""
    found = find_chromium()
    if found is None:
        msg = "no chromium installed (apt-get install chromium)"
        if os.environ.get(ENV_REQUIRE) == "1":
            pytest.fail(f"{msg}; {ENV_REQUIRE}=1 requires it")
        pytest.skip(msg)
    return found


@dataclass
class PageVisit:
    """What loading one page did."""

    console_errors: list[str] = field(default_factory=list)  # console.error, exceptions, error log entries
    requests: list[str] = field(default_factory=list)  # every URL the page requested
    probes: dict[str, Any] = field(default_factory=dict)  # name -> the probe expression's value
    screenshot: bytes | None = None  # PNG, when asked for


class _Pipe:
    def __init__(self, browser: str, profile: str, width: int, height: int) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, its fd 4 writes to us
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for obj in self._read():
                if obj.get("id") == self._next:
                    if "error" in obj:
                        raise RuntimeError(f"{method}: {obj['error']}")
                    return dict(obj.get("result") or {})
                self.events.append(obj)
        raise TimeoutError(method)

    def _read(self) -> list[dict[str, Any]]:
        chunk = os.read(self._r, 1 << 20)
        if not chunk:
            raise RuntimeError("chromium closed the DevTools pipe")
        self._buf += chunk
        *whole, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in whole if m]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


def open_page(
    path: Path,
    probes: dict[str, str],
    *,
    settle: str | None = None,
    timeout: float = 60.0,
    screenshot: bool = False,
    width: int = 1320,
    height: int = 900,
) -> PageVisit:
    """Load ``path`` and evaluate each probe (a JS expression, awaited) once ``settle`` is true."""
    browser = require_chromium()
    visit = PageVisit()
    with tempfile.TemporaryDirectory(prefix="cosyclone-chromium-") as profile:
        pipe = _Pipe(browser, profile, width, height)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            deadline = time.monotonic() + timeout

            def evaluate(expr: str) -> Any:
                res = pipe.send(
                    "Runtime.evaluate",
                    {"expression": expr, "awaitPromise": True, "returnByValue": True},
                    session=session,
                )
                if "exceptionDetails" in res:
                    raise RuntimeError(f"{expr}: {res['exceptionDetails']}")
                return res.get("result", {}).get("value")

            while evaluate("document.readyState") != "complete":
                if time.monotonic() > deadline:
                    raise TimeoutError("the page did not load")
                time.sleep(0.1)
            while settle and not evaluate(settle):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            visit.probes = {name: evaluate(expr) for name, expr in probes.items()}
            if screenshot:
                import base64

                clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}  # the page's top
                shot = pipe.send(
                    "Page.captureScreenshot",
                    {"format": "png", "captureBeyondViewport": True, "clip": clip},
                    session=session,
                )
                visit.screenshot = base64.b64decode(shot["data"])
            evaluate("1")  # drain the events that arrived meanwhile
        finally:
            pipe.close()
    for ev in pipe.events:
        method, params = ev.get("method"), ev.get("params") or {}
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            visit.console_errors.append(json.dumps(params.get("args")))
        elif method == "Runtime.exceptionThrown":
            visit.console_errors.append(json.dumps(params.get("exceptionDetails")))
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            visit.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            visit.requests.append(str((params.get("request") or {}).get("url")))
    return visit


if __name__ == "__main__":
    page, out = Path(sys.argv[1]), Path(sys.argv[2])
    w, h = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (1320, 900)
    got = open_page(page, {}, screenshot=True, width=w, height=h)
    assert got.screenshot is not None
    out.write_bytes(got.screenshot)
    print(f"{out}: {len(got.screenshot)} bytes; console errors {got.console_errors}")
