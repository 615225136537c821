// The session websocket (docs/PROTOCOL.md) with reconnection.
//
// The first connection of a page asks for no resume: the server replays every active
// turn from seq 1, and the page drops what it already shows as committed messages. After a
// dropped socket it reconnects with `?resume=<turn>:<seq>,...` (the last seq seen per turn)
// and capped exponential backoff, so only the gap is replayed.

// The first retry comes quickly (a blip), then doubles up to the cap: with the cap at
// 1.5 s (and jitter below it), a page is live again within about 2 s of the server being
// back, while a restart's reconnects from many pages still spread out.
const BACKOFF_FIRST_MS = 250;
const BACKOFF_MAX_MS = 1500;
// Close codes after which reconnecting cannot help (signed out, no such session).
const FINAL_CODES = new Set([4401, 4404]);

export class SessionSocket {
  constructor(path, { onEvent, onStatus, resumePositions }) {
    this.path = path;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.resumePositions = resumePositions;
    this.ws = null;
    this.attempt = 0;
    this.everOpened = false;
    this.stopped = false;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    let url = `${scheme}//${location.host}${this.path}`;
    if (this.everOpened) {
      const positions = this.resumePositions();
      const resume = Object.entries(positions)
        .filter(([, seq]) => seq > 0)
        .map(([turn, seq]) => `${turn}:${seq}`)
        .join(",");
      if (resume) url += `?resume=${encodeURIComponent(resume)}`;
    }
    return url;
  }

  connect() {
    const ws = new WebSocket(this.url());
    this.ws = ws;
    this.timer = null;
    ws.addEventListener("open", () => {
      this.attempt = 0;
      this.everOpened = true;
      this.onStatus("open");
    });
    ws.addEventListener("message", (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch {
        return;
      }
      if (event && typeof event.type === "string") this.onEvent(event);
    });
    ws.addEventListener("close", (close) => {
      if (this.ws !== ws) return;
      if (this.stopped || FINAL_CODES.has(close.code)) {
        this.onStatus(close.code === 4401 ? "signed-out" : "closed");
        return;
      }
      const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** this.attempt);
      this.attempt += 1;
      // Jitter: many pages dropped by one server restart should not return in lockstep.
      const wait = delay / 2 + Math.random() * (delay / 2);
      this.onStatus("reconnecting", wait);
      this.timer = setTimeout(() => this.connect(), wait);
    });
  }

  // The browser says the network is back: try now rather than at the next backoff step.
  retryNow() {
    if (!this.timer || (this.ws && this.ws.readyState === WebSocket.OPEN)) return;
    clearTimeout(this.timer);
    this.timer = null;
    this.connect();
  }

  send(message) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }
}
