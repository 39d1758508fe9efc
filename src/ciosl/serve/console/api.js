// The console's calls to the server: the token (this tab's session storage, sent as a bearer
// header, never in a URL), JSON requests whose errors become one line, the events stream read
// with fetch() (EventSource cannot send a header) and .npy feature files parsed in the page.

const TOKEN_KEY = "ciosl-token";

export function token() { return sessionStorage.getItem(TOKEN_KEY); }
export function setToken(value) {
  if (value === null) sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, value);
}

// An error the page shows as it is: one line, never a stack trace.
export class ApiError extends Error {
  constructor(status, line) { super(oneLine(line)); this.status = status; }
}

export function oneLine(text) {
  const line = String(text ?? "").split(/\r?\n/).find((l) => l.trim()) ?? "";
  return line.length > 400 ? line.slice(0, 400) + "..." : line;
}

export function learnerPath(name, what) {
  return `/v1/learners/${encodeURIComponent(name)}` + (what ? `/${what}` : "");
}

// A request to the API; the answer's JSON, or an ApiError naming what the server said.
export async function api(path, { method = "GET", body, auth = true } = {}) {
  const headers = {};
  if (auth) headers.Authorization = `Bearer ${token() ?? ""}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store", credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(0, `cannot reach the server: ${e.message}`);
  }
  const text = await response.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = null; }
  if (!response.ok) {
    const said = doc && typeof doc.error === "string" ? doc.error : text || response.statusText;
    throw new ApiError(response.status, `${response.status}: ${oneLine(said)}`);
  }
  if (doc === null) throw new ApiError(response.status, `${path}: the answer is not JSON`);
  return doc;
}

// A learn's id, unique enough for the server's idempotency window.
export function requestId() {
  const b = new Uint8Array(12);
  crypto.getRandomValues(b);
  return "console-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// The events stream of one learner: calls onEvent(name, data, id) for each event, reconnects
// with Last-Event-ID after a drop (1 s, doubling to 15 s; at once on reconnect()), until stop().
export function streamEvents(name, { onEvent, onState }) {
  let lastId = null;
  let stopped = false;
  let controller = null;
  let delay = 1000;
  let now = false; // reconnect() asked: no wait before the next try

  async function once() {
    controller = new AbortController();
    const headers = { Authorization: `Bearer ${token() ?? ""}`, Accept: "text/event-stream" };
    if (lastId !== null) headers["Last-Event-ID"] = lastId;
    const response = await fetch(learnerPath(name, "events"), {
      headers, signal: controller.signal, cache: "no-store", credentials: "omit",
    });
    if (!response.ok) {
      let said = await response.text();
      try { said = JSON.parse(said).error ?? said; } catch (e) { /* not JSON: as it is */ }
      const err = new ApiError(response.status, `${response.status}: ${oneLine(said)}`);
      throw err;
    }
    onState("live", lastId === null ? "connected" : `reconnected after event ${lastId}`);
    delay = 1000;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        dispatch(block);
      }
    }
  }

  function dispatch(block) {
    let event = "message";
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
    }
    if (id !== null) lastId = id;
    if (!data.length) return;
    let parsed;
    try { parsed = JSON.parse(data.join("\n")); } catch (e) { return; }
    onEvent(event, parsed, id);
  }

  async function loop() {
    while (!stopped) {
      try {
        await once();
        if (!stopped) onState("retry", "the stream ended; reconnecting");
      } catch (e) {
        if (stopped) return;
        if (e instanceof ApiError && (e.status === 401 || e.status === 404)) {
          onState("error", e.message);
          return;
        }
        onState("retry", `${oneLine(e.message)}; reconnecting in ${delay / 1000} s`);
      }
      if (!now) {
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 2, 15000);
      }
      now = false;
    }
  }
  loop();
  return {
    stop() { stopped = true; if (controller) controller.abort(); },
    reconnect() { now = true; if (controller) controller.abort(); },
  };
}

// A .npy file (NumPy's format, versions 1-3): float32 or float64, little-endian, 1-d (one
// sample) or 2-d (one row per sample), C order. Returns an array of rows, or throws one line.
export function parseNpy(buffer, fileName) {
  const bytes = new Uint8Array(buffer);
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (bytes.length < 10 || magic.some((b, i) => bytes[i] !== b)) {
    throw new Error(`${fileName}: not a .npy file`);
  }
  const view = new DataView(buffer);
  const major = bytes[6];
  let headerLen, start;
  if (major === 1) { headerLen = view.getUint16(8, true); start = 10; }
  else if (major === 2 || major === 3) { headerLen = view.getUint32(8, true); start = 12; }
  else throw new Error(`${fileName}: .npy version ${major} is not read`);
  const header = new TextDecoder(major === 3 ? "utf-8" : "latin1")
    .decode(bytes.subarray(start, start + headerLen));
  const descr = /'descr':\s*'([^']*)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shapeText) throw new Error(`${fileName}: a malformed .npy header`);
  const size = { "<f4": 4, "<f8": 8, "|f4": 4, "|f8": 8 }[descr[1]];
  if (!size) {
    throw new Error(`${fileName}: dtype ${descr[1]}; the console reads float32 or float64 ` +
                    "(little-endian)");
  }
  const shape = shapeText[1].split(",").map((s) => s.trim()).filter(Boolean).map(Number);
  if (shape.length < 1 || shape.length > 2 || shape.some((n) => !Number.isInteger(n))) {
    throw new Error(`${fileName}: shape (${shapeText[1]}); expected 1-d or 2-d`);
  }
  if (fortran[1] === "True" && shape.length === 2 && shape[0] > 1 && shape[1] > 1) {
    throw new Error(`${fileName}: Fortran order is not read (save it with np.save of a ` +
                    "C-ordered array)");
  }
  const [n, d] = shape.length === 1 ? [1, shape[0]] : shape;
  const offset = start + headerLen;
  if (n < 1 || d < 1) throw new Error(`${fileName}: no samples (shape ${shape.join(" x ")})`);
  if (buffer.byteLength - offset !== n * d * size) {
    throw new Error(`${fileName}: ${buffer.byteLength - offset} data bytes, expected ` +
                    `${n * d * size}`);
  }
  const rows = [];
  for (let i = 0; i < n; i++) {
    const row = new Array(d);
    for (let j = 0; j < d; j++) {
      const at = offset + (i * d + j) * size;
      row[j] = size === 4 ? view.getFloat32(at, true) : view.getFloat64(at, true);
      if (!Number.isFinite(row[j])) {
        throw new Error(`${fileName}: row ${i}, column ${j} is ${row[j]}; features are finite`);
      }
    }
    rows.push(row);
  }
  return rows;
}
