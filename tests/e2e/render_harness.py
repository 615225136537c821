"""A page that holds only the chat page's renderer modules (static/js/renderer.js and
stream.js), served from the working tree with the app's Content-Security-Policy: for
tests and bench/render.py that drive the renderer in Chromium without the whole stack.

The page exposes `window.harness` (module scripts only: the CSP forbids inline script).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from openworker.middleware import CONTENT_SECURITY_POLICY

STATIC = Path(__file__).resolve().parents[2] / "static"

TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css"}

PAGE = """<!doctype html>
<html lang="en" data-theme="light"><head><meta charset="utf-8"><title>renderer</title>
<link rel="stylesheet" href="/static/css/app.css"></head>
<body><main><div id="out" class="msg-body markdown"></div><div data-live></div></main>
<script type="module" src="/static/__harness.js"></script></body></html>
"""

SCRIPT = """
import { LiveMarkdown, renderMarkdown } from "/static/js/renderer.js";
import { StreamView } from "/static/js/stream.js";
window.harness = {
  // Feed `chunks` one by one (each as its own update), then finish; the HTML at the end.
  live(chunks) {
    const out = document.getElementById("out");
    const live = new LiveMarkdown(out);
    for (const chunk of chunks) live.append(chunk);
    live.finish();
    return out.innerHTML;
  },
  whole(text) {
    const out = document.getElementById("out");
    renderMarkdown(out, text);
    return out.innerHTML;
  },
  // The page's streaming path: a StreamView, one delta per socket frame at `everyMs`;
  // resolves with [chars so far, main-thread ms] for each applied update.
  stream(chunks, everyMs) {
    const timings = [];
    const view = new StreamView("bench", document.querySelector("[data-live]"), {
      onRender: (ms, chars) => timings.push([chars, ms]),
    });
    return new Promise((resolve) => {
      let i = 0;
      const tick = () => {
        if (i >= chunks.length) {
          requestAnimationFrame(() => { view.finish(); resolve(timings); });
          return;
        }
        view.push(chunks[i++], "");
        setTimeout(tick, everyMs);
      };
      tick();
    });
  },
};
window.harnessReady = true;
"""


class HarnessServer:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/":
                    self._send(PAGE.encode(), "text/html; charset=utf-8")
                elif path == "/static/__harness.js":
                    self._send(SCRIPT.encode(), "text/javascript")
                elif path.startswith("/static/"):
                    target = (STATIC / path[len("/static/") :]).resolve()
                    if STATIC not in target.parents or not target.is_file():
                        self.send_error(404)
                        return
                    kind = TYPES.get(target.suffix, "application/octet-stream")
                    self._send(target.read_bytes(), kind)
                else:
                    self.send_error(404)

            def _send(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def open_harness(browser: object, server: HarnessServer) -> object:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(server.url)
    page.wait_for_function("window.harnessReady === true")
    return page
