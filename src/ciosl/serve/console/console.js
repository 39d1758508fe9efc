// The console's views: sign in, learners, teach, ask, watch. Every text from the server (labels,
// names, errors) is put in the page with textContent, never parsed as HTML.

import { api, ApiError, learnerPath, oneLine, requestId, setToken, streamEvents, token }
  from "./api.js";
import { drawLines } from "./charts.js";
import { burst, grab, readFiles, startCamera } from "./media.js";

const $ = (id) => document.getElementById(id);
const VIEWS = ["signin", "learners", "teach", "ask", "watch"];
const LEARNER_KEY = "ciosl-learner";
const HISTORY = 600; // points kept per chart series

const state = {
  health: null, learner: null, classes: [], methods: [], stream: null,
  acc: [], accLast: [], learnRate: [], predictRate: [], events: 0,
};

// ---------------------------------------------------------------- small helpers
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function say(id, text) { $(id).textContent = text ?? ""; }
function fail(id, e) { say(id, e instanceof Error ? oneLine(e.message) : oneLine(e)); }
function pct(v) { return v === null || v === undefined ? "-" : `${(100 * v).toFixed(1)}%`; }
function num(v, digits = 1) {
  return v === null || v === undefined || Number.isNaN(v) ? "-" : Number(v).toFixed(digits);
}
function quoted(label) { return `\u201c${label}\u201d`; }

// a label typed in the page, as the learner's labels are: integers stay integers
function asLabel(text) {
  const t = text.trim();
  const numeric = state.classes.length && state.classes.every((c) => typeof c === "number");
  return numeric && /^-?\d+$/.test(t) ? Number(t) : t;
}

// ---------------------------------------------------------------- views
function show(view) {
  if (!VIEWS.includes(view)) view = "learners";
  if (view !== "signin" && !token()) view = "signin";
  for (const v of VIEWS) $(`view-${v}`).hidden = v !== view;
  for (const b of document.querySelectorAll("#nav [data-view]")) {
    if (b.dataset.view === view) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  if (view === "learners") refreshLearners();
  if (view === "watch") redraw();
  if (location.hash !== `#${view}`) history.replaceState(null, "", `#${view}`);
}

async function describeServer() {
  try {
    state.health = await api("/v1/health", { auth: false });
  } catch (e) {
    state.health = null;
    say("where", `the server: ${oneLine(e.message)}`);
    return;
  }
  const h = state.health;
  const extractor = h.extractor ? `images through ${h.extractor}` : "features only (no extractor)";
  const n = h.learners ?? "?";
  say("where", `${location.host}: ${n} learner${n === 1 ? "" : "s"}, ${extractor}`);
  const withImages = Boolean(h.extractor);
  $("teach-noextractor").hidden = withImages;
  for (const id of ["teach-camera", "ask-camera"]) $(id).hidden = !withImages;
  for (const node of document.querySelectorAll(".files-what")) {
    node.textContent = withImages ? "(PNG, JPEG, WebP or .npy)" : "(.npy feature files)";
  }
  for (const id of ["teach-files", "ask-files"]) {
    $(id).accept = withImages ? "image/*,.npy" : ".npy";
  }
}

// ---------------------------------------------------------------- sign in
async function signIn(value, quiet) {
  setToken(value);
  try {
    const doc = await api("/v1/learners");
    say("signin-error", "");
    $("nav").hidden = false;
    renderLearners(doc.learners);
    await loadMethods();
    const kept = sessionStorage.getItem(LEARNER_KEY);
    const names = doc.learners.map((l) => l.name);
    const pick = names.includes(kept) ? kept : names.includes("default") ? "default" : names[0];
    if (pick) await choose(pick);
    const inUse = doc.learners.find((l) => l.name === pick); // the form starts at its method
    if (inUse && state.methods.some((m) => m.name === inUse.method)) {
      $("create-method").value = inUse.method;
      renderSettings();
    }
    const asked = location.hash.slice(1);
    show(asked && asked !== "signin" ? asked : "learners");
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) setToken(null); // else: kept for a retry
    $("nav").hidden = true;
    show("signin");
    if (quiet && e instanceof ApiError && e.status === 401) {
      say("signin-error", "The token this tab kept was refused (has the server a new one?): " +
          "sign in again");
    } else if (e instanceof ApiError && e.status === 401) {
      say("signin-error", `Wrong token: the server refused it (${oneLine(e.message)})`);
    } else fail("signin-error", e);
  }
}

function signOut() {
  if (state.stream) state.stream.stop();
  state.stream = null;
  setToken(null);
  sessionStorage.removeItem(LEARNER_KEY);
  $("nav").hidden = true;
  $("token").value = "";
  show("signin");
}

// ---------------------------------------------------------------- learners
async function refreshLearners() {
  try {
    renderLearners((await api("/v1/learners")).learners);
    say("learners-error", "");
  } catch (e) { fail("learners-error", e); }
}

function renderLearners(rows) {
  const body = $("learners-table").tBodies[0];
  body.replaceChildren(...rows.map((r) => {
    const current = r.name === state.learner;
    const use = el("button", {
      type: "button", text: current ? "in use" : "use",
      "aria-label": current ? `${r.name} is in use` : `use ${r.name}`,
      onclick: () => choose(r.name).then(refreshLearners),
    });
    if (current) use.disabled = true;
    return el("tr", current ? { class: "current" } : {},
      el("th", { scope: "row", text: r.name }), el("td", { text: r.method }),
      el("td", { text: r.seen }), el("td", { text: r.classes }),
      el("td", { text: pct(r.accuracy) }), el("td", {}, use));
  }));
}

async function loadMethods() {
  try {
    state.methods = (await api("/v1/methods")).methods;
  } catch (e) { fail("create-error", e); return; }
  const select = $("create-method");
  select.replaceChildren(...state.methods.map((m) => el("option", { value: m.name, text: m.name })));
  renderSettings();
}

function settingText(v, type) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number" && Number.isInteger(v) && /float/.test(type)) return v.toFixed(1);
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function renderSettings() {
  const method = state.methods.find((m) => m.name === $("create-method").value);
  say("create-method-help", method ? method.description : "");
  const box = $("create-settings");
  box.replaceChildren();
  if (!method) return;
  for (const s of method.settings) {
    const id = `setting-${s.name}`;
    const input = el("input", { id, name: s.name, "aria-describedby": `${id}-help` });
    input.value = settingText(s.default, String(s.type ?? ""));
    input.dataset.default = input.value;
    input.dataset.type = String(s.type ?? "");
    box.append(el("label", { for: id, text: s.name }), input,
               el("p", { id: `${id}-help`, class: "help",
                         text: `${s.help || ""} (default ${input.value || "none"})` }));
  }
}

function settingValue(text, type) {
  const t = text.trim();
  if (/bool/.test(type) && /^(true|false)$/i.test(t)) return t.toLowerCase() === "true";
  if (/int|float|number/.test(type) && t !== "" && !Number.isNaN(Number(t))) return Number(t);
  if (/^[[{]/.test(t)) { try { return JSON.parse(t); } catch (e) { return t; } }
  return t;
}

async function create(event) {
  event.preventDefault();
  say("create-error", "");
  say("create-status", "");
  const settings = {};
  for (const input of $("create-settings").querySelectorAll("input")) {
    if (input.value !== input.dataset.default) {
      settings[input.name] = settingValue(input.value, input.dataset.type);
    }
  }
  const name = $("create-name").value.trim();
  try {
    const made = await api("/v1/learners", {
      method: "POST", body: { name, method: $("create-method").value, settings },
    });
    say("create-status", `Created ${made.name} (${made.method}); it is now in use.`);
    $("create-name").value = "";
    await choose(made.name);
    await refreshLearners();
    await describeServer();
  } catch (e) { fail("create-error", e); }
}

// ---------------------------------------------------------------- the learner in use
async function choose(name) {
  if (state.stream) state.stream.stop();
  state.learner = name;
  sessionStorage.setItem(LEARNER_KEY, name);
  for (const node of document.querySelectorAll(".learner-name")) node.textContent = name;
  Object.assign(state, { acc: [], accLast: [], learnRate: [], predictRate: [], events: 0 });
  $("events").replaceChildren();
  $("answers").replaceChildren();
  try {
    const doc = await api(learnerPath(name));
    setClasses(doc.classes_list ?? []);
  } catch (e) { fail("watch-error", e); }
  try { onScore(await api(learnerPath(name, "metrics"))); } catch (e) { fail("watch-error", e); }
  state.stream = streamEvents(name, {
    onEvent, onState: (kind, text) => say("stream-status", `events: ${text}`),
  });
}

function setClasses(list) {
  state.classes = list;
  $("known-labels").replaceChildren(...list.map((c) => el("option", { value: String(c) })));
}

// ---------------------------------------------------------------- teach
function teachLabel() {
  const label = $("teach-label").value;
  if (!label.trim()) throw new Error("Label: type the label of what you show first");
  return asLabel(label);
}

async function teach(items) {
  say("teach-error", "");
  say("teach-status", "");
  if (!state.learner) { say("teach-error", "no learner in use: create or choose one"); return; }
  let label;
  try { label = teachLabel(); } catch (e) { fail("teach-error", e); return; }
  const { images = [], rows = [] } = items;
  const n = images.length + rows.length;
  if (!n) return;
  const body = images.length ? { images: images.map((i) => i.image) } : { x: rows.map((r) => r.x) };
  Object.assign(body, { y: Array(n).fill(label), id: requestId() });
  say("teach-status", `sending ${n} as ${quoted(label)}...`);
  try {
    const ack = await api(learnerPath(state.learner, "learn"), { method: "POST", body });
    const again = ack.duplicate ? " (already learned: a duplicate)" : "";
    say("teach-status", `Learned ${ack.learned} as ${quoted(label)}${again}: the learner ` +
        `has seen ${ack.seen}, record ${ack.seq}.`);
    const shown = images.map((i) => el("img", { src: i.thumb, alt: `${label}: ${i.name}` }))
      .concat(rows.map((r) => el("span", { class: "chip", text: r.name })));
    $("teach-sent").prepend(el("figure", {}, ...shown,
      el("figcaption", { text: `${quoted(label)}: ${n} (record ${ack.seq})` })));
    while ($("teach-sent").children.length > 12) $("teach-sent").lastChild.remove();
  } catch (e) { say("teach-status", ""); fail("teach-error", e); }
}

async function teachFiles(files) {
  try {
    await teach(await readFiles(files, Boolean(state.health && state.health.extractor)));
  } catch (e) { fail("teach-error", e); }
}

// ---------------------------------------------------------------- ask
async function ask(items) {
  say("ask-error", "");
  if (!state.learner) { say("ask-error", "no learner in use: create or choose one"); return; }
  const { images = [], rows = [] } = items;
  const body = images.length ? { images: images.map((i) => i.image) } : { x: rows.map((r) => r.x) };
  if (!images.length && !rows.length) return;
  try {
    const doc = await api(learnerPath(state.learner, "predict"), { method: "POST", body });
    const asked = images.length ? images : rows;
    const cards = asked.map((item, i) => answerCard(item, doc, i));
    $("answers").prepend(...cards);
    while ($("answers").children.length > 8) $("answers").lastChild.remove();
  } catch (e) { fail("ask-error", e); }
}

function answerCard(item, doc, i) {
  const proba = doc.proba[i];
  const top = proba.map((p, k) => [p, doc.classes[k]]).sort((a, b) => b[0] - a[0]).slice(0, 3);
  const answered = doc.label[i];
  const pid = doc.prediction_id ? doc.prediction_id[i] : null;
  const what = item.thumb ? el("img", { src: item.thumb, alt: `asked: ${item.name}` })
    : el("span", { class: "chip", text: item.name });
  const list = el("ol", { class: "top" }, ...top.map(([p, c]) => {
    const meter = el("meter", { min: "0", max: "1", value: String(p), "aria-hidden": "true" });
    return el("li", {}, el("span", { class: "answer-label", text: String(c) }), meter,
              el("span", { class: "proba", text: pct(p) }));
  }));
  const card = el("article", { class: "answer", "aria-label": `answer ${pid ?? i}` }, what);
  const novel = doc.novel && doc.novel[i];
  card.append(novel ? el("p", { class: "novel", text: "I have not seen this before." })
    : el("p", { class: "verdict" }, "It is ", el("strong", { text: String(answered) })));
  card.append(list);
  const result = el("p", { class: "feedback-result", role: "status" });
  const error = el("p", { class: "error", role: "alert" });
  if (pid) {
    const fid = `fix-${pid}`;
    const right = el("button", { type: "button", class: "confirm", text: "Right" });
    const input = el("input", { id: fid, class: "fix-label", list: "known-labels" });
    const wrong = el("button", { type: "button", class: "correct", text: "Correct it" });
    const controls = [right, input, wrong];
    const send = async (label) => {
      if (String(label).trim() === "") {
        error.textContent = "Correct it: type the right label first";
        return;
      }
      controls.forEach((c) => { c.disabled = true; });
      error.textContent = "";
      try {
        const fb = await api(learnerPath(state.learner, "feedback"), {
          method: "POST", body: { prediction_id: pid, y: label },
        });
        const ok = fb.correct && fb.correct[0];
        result.textContent = `Learned: it is ${quoted(label)}; the answer was ` +
          `${ok ? "right" : "wrong"} (record ${fb.seq}).`;
      } catch (e) {
        error.textContent = oneLine(e.message);
        if (!(e instanceof ApiError) || e.status >= 500 || e.status === 0) {
          controls.forEach((c) => { c.disabled = false; });
        }
      }
    };
    right.addEventListener("click", () => send(answered));
    wrong.addEventListener("click", () => send(asLabel(input.value)));
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") wrong.click(); });
    card.append(el("div", { class: "row" }, right,
      el("label", { for: fid, text: "or it is" }), input, wrong));
  }
  card.append(result, error);
  return card;
}

// ---------------------------------------------------------------- watch
function onEvent(name, data, id) {
  state.events += 1;
  let text = null;
  if (name === "learn") text = `learned ${data.learned} (seen ${data.seen}, record ${data.seq})`;
  else if (name === "class") {
    text = `new class ${quoted(data.label)}`;
    if (!state.classes.includes(data.label)) setClasses(state.classes.concat([data.label]));
  } else if (name === "feedback") {
    text = `feedback: answered ${quoted(data.answered)}, it is ${quoted(data.y)} ` +
      `(${data.correct ? "right" : "wrong"})`;
  } else if (name === "score") onScore(data);
  if (text !== null) {
    $("events").prepend(el("li", { "data-event": name, "data-id": id ?? "", text }));
    while ($("events").children.length > 30) $("events").lastChild.remove();
  }
}

function onScore(m) {
  const t = performance.now() / 1000;
  const push = (list, v) => {
    if (v === null || v === undefined) return;
    list.push([t, v]);
    if (list.length > HISTORY) list.shift();
  };
  push(state.acc, m.accuracy);
  push(state.accLast, m.accuracy_last);
  const rates = m.rates || {};
  push(state.learnRate, rates.learn_per_s);
  push(state.predictRate, rates.predict_per_s);
  say("acc-now", pct(m.accuracy));
  const checked = m.feedback ?? 0;
  say("acc-detail", `${checked} answer${checked === 1 ? "" : "s"} checked by feedback; the ` +
      `last ${m.window ?? "-"}: ${pct(m.accuracy_last)}`);
  say("learn-rate", `${num(rates.learn_per_s)} /s`);
  say("learn-detail", `${m.seen ?? 0} samples seen; median ${num(rates.learn_p50_ms)} ms`);
  say("predict-rate", `${num(rates.predict_per_s)} /s`);
  say("predict-detail", `median ${num(rates.predict_p50_ms)} ms per answer`);
  if (Array.isArray(m.classes)) setClasses(m.classes);
  const counts = m.counts || {}, recall = m.recall || {};
  const labels = Array.isArray(m.classes) ? m.classes.map(String) : Object.keys(counts);
  $("classes-table").tBodies[0].replaceChildren(...labels.map((c) => el("tr", {},
    el("th", { scope: "row", text: c }), el("td", { text: counts[c] ?? 0 }),
    el("td", { text: pct(recall[c]) }))));
  if (!$("view-watch").hidden) redraw();
}

function redraw() {
  drawLines($("acc-chart"), [{ name: "since the start", points: state.acc },
    { name: "the last window", points: state.accLast }], { yMax: 1 });
  drawLines($("rate-chart"), [{ name: "learned /s", points: state.learnRate },
    { name: "answers /s", points: state.predictRate }]);
  const last = (list) => (list.length ? list[list.length - 1][1] : null);
  say("acc-chart-text", `Accuracy now ${pct(last(state.acc))} since the start, ` +
      `${pct(last(state.accLast))} over the last window (${state.acc.length} points).`);
  say("rate-chart-text", `Now ${num(last(state.learnRate))} samples learned and ` +
      `${num(last(state.predictRate))} answers per second.`);
}

// ---------------------------------------------------------------- wiring
function cameraPanel(panelId, onReady) {
  const panel = $(panelId);
  const video = panel.querySelector("video");
  panel.querySelector(".camera-start").addEventListener("click", async (e) => {
    const errorId = panelId.startsWith("teach") ? "teach-error" : "ask-error";
    try {
      await startCamera(video);
      video.classList.add("on");
      e.target.disabled = true;
      say(errorId, "");
      onReady();
    } catch (err) { fail(errorId, err); }
  });
  return video;
}

function dropZone(zoneId, onFiles) {
  const zone = $(zoneId);
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    onFiles(e.dataTransfer.files);
  });
}

function wire() {
  $("signin-form").addEventListener("submit", (e) => {
    e.preventDefault();
    signIn($("token").value.trim(), false);
  });
  $("signout").addEventListener("click", signOut);
  for (const b of document.querySelectorAll("#nav [data-view]")) {
    b.addEventListener("click", () => {
      show(b.dataset.view);
      $(`h-${b.dataset.view}`).focus({ preventScroll: true }); // a screen reader reads the view
    });
  }
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  $("create-method").addEventListener("change", renderSettings);
  $("create-form").addEventListener("submit", create);

  const teachVideo = cameraPanel("teach-camera", () => {
    $("teach-one").disabled = false;
    $("teach-burst").disabled = false;
  });
  $("teach-one").addEventListener("click", () => teach({ images: [grab(teachVideo)] }));
  $("teach-burst").addEventListener("click", async (e) => {
    let label;
    try { label = teachLabel(); } catch (err) { fail("teach-error", err); return; }
    const n = Math.max(2, Math.min(64, Math.round(Number($("burst-n").value) || 8)));
    const s = Math.max(0.5, Math.min(30, Number($("burst-s").value) || 3));
    e.target.disabled = true;
    try {
      const frames = await burst(teachVideo, n, s, (k) =>
        say("teach-status", `frame ${k} of ${n} for ${quoted(label)}...`));
      await teach({ images: frames });
    } finally { e.target.disabled = false; }
  });
  $("teach-files").addEventListener("change", async (e) => {
    await teachFiles(e.target.files);
    e.target.value = "";
  });
  dropZone("teach-drop", teachFiles);

  const askVideo = cameraPanel("ask-camera", () => { $("ask-frame").disabled = false; });
  $("ask-frame").addEventListener("click", () => ask({ images: [grab(askVideo)] }));
  const askFiles = async (files) => {
    try {
      await ask(await readFiles(files, Boolean(state.health && state.health.extractor)));
    } catch (e) { fail("ask-error", e); }
  };
  $("ask-files").addEventListener("change", async (e) => {
    await askFiles(e.target.files);
    e.target.value = "";
  });
  dropZone("ask-drop", askFiles);
  window.addEventListener("resize", () => { if (!$("view-watch").hidden) redraw(); });
  // the network is back (a phone, a laptop's lid): the stream is likely dead, read it again
  window.addEventListener("online", () => { if (state.stream) state.stream.reconnect(); });
}

async function start() {
  wire();
  await describeServer();
  if (token()) await signIn(token(), true);
  else show("signin");
}

start();
