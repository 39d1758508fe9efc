// Line charts drawn on a canvas by the page itself (no chart library): series of
// [time in seconds, value] points, the x axis the last minutes, the y axis from 0.

const COLOURS = ["#1f6fb2", "#c4501b", "#2e8b57", "#7a4bb3"];

function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return { ctx, width, height };
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 5, 10]) if (m * p >= value) return m * p;
  return 10 * p;
}

function label(v) {
  if (v >= 100) return v.toFixed(0);
  if (v >= 10) return v.toFixed(1).replace(/\.0$/, "");
  return String(Math.round(v * 100) / 100);
}

// series: [{name, points: [[t, v], ...]}]; yMax: fixed top (1 for accuracy) or null (fitted)
export function drawLines(canvas, series, { yMax = null, unit = "" } = {}) {
  const { ctx, width, height } = prepare(canvas);
  const style = getComputedStyle(canvas);
  const ink = style.color || "#222";
  ctx.clearRect(0, 0, width, height);
  const left = 44, right = 10, top = 22, bottom = 24;
  const w = Math.max(10, width - left - right), h = Math.max(10, height - top - bottom);
  const all = series.flatMap((s) => s.points);
  const t1 = all.length ? Math.max(...all.map((p) => p[0])) : 1;
  const t0 = all.length ? Math.min(...all.map((p) => p[0])) : 0;
  const span = Math.max(t1 - t0, 10);
  const top_ = yMax ?? niceMax(Math.max(0, ...all.map((p) => p[1])) * 1.1);
  const x = (t) => left + ((t - (t1 - span)) / span) * w;
  const y = (v) => top + h - (Math.min(v, top_) / top_) * h;

  ctx.font = "12px system-ui, sans-serif";
  ctx.lineWidth = 1;
  ctx.strokeStyle = "rgba(128,128,128,0.35)";
  ctx.fillStyle = ink;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const v = (top_ * i) / 4;
    ctx.beginPath();
    ctx.moveTo(left, y(v));
    ctx.lineTo(left + w, y(v));
    ctx.stroke();
    ctx.fillText(label(v) + unit, left - 4, y(v));
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  ctx.fillText(`the last ${Math.round(span)} s`, left + w / 2, top + h + 6);

  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  let legendX = left;
  series.forEach((s, k) => {
    const colour = COLOURS[k % COLOURS.length];
    ctx.fillStyle = colour;
    ctx.fillRect(legendX, 6, 10, 10);
    ctx.fillStyle = ink;
    ctx.fillText(s.name, legendX + 14, 15);
    legendX += 24 + ctx.measureText(s.name).width;
    if (!s.points.length) return;
    ctx.strokeStyle = colour;
    ctx.lineWidth = k ? 2 : 4; // the first under the second, both seen where they meet
    ctx.setLineDash(k ? [6, 4] : []);
    ctx.beginPath();
    s.points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    ctx.setLineDash([]);
    const [tl, vl] = s.points[s.points.length - 1];
    ctx.fillStyle = colour;
    ctx.beginPath();
    ctx.arc(x(tl), y(vl), 3, 0, 2 * Math.PI);
    ctx.fill();
  });
  if (!all.length) {
    ctx.fillStyle = ink;
    ctx.textAlign = "center";
    ctx.fillText("no data yet", left + w / 2, top + h / 2);
  }
}
