// monitor.js — the live monitor: polls GET /status once a second and plots, over the last two
// minutes, the decode and prefill rates, time to first token, the streams; per worker its backend,
// expert-cache hit rate and occupancy, memory, swaps per window and the copy link's busy share;
// and a layer x expert heat map of the routing (the last 10 s, or since the worker started).
'use strict';

const $ = (id) => document.getElementById(id);
const KEEP = 120, HEAT_SPAN = 10;
const COLORS = ['#3b6fd8', '#e07b24', '#2e9e5b', '#b4458f', '#8c6d1f'];
let prev = null, heatRing = [], started = false;

// A plot: named series of numbers (null: a gap) over the last KEEP samples; the y axis runs from
// 0 to `top` when given (shares: 1), else to the largest value shown.
class Plot {
  constructor(id, names, fmt, top) {
    this.cv = $(id);
    this.top = top;
    this.names = names;
    this.fmt = fmt || ((v) => (v >= 100 ? v.toFixed(0) : v.toFixed(v >= 10 ? 1 : 2)));
    this.data = names.map(() => []);
    this.legend = $(id.replace(/^p-/, 'l-'));
  }
  push(values) {
    values.forEach((v, i) => {
      const d = this.data[i];
      d.push(v === undefined || Number.isNaN(v) ? null : v);
      if (d.length > KEEP) d.shift();
    });
    this.cv.dataset.points = String(this.data[0].length);
    this.draw();
  }
  draw() {
    const cv = this.cv, dpr = window.devicePixelRatio || 1;
    const w = cv.clientWidth * dpr, h = cv.clientHeight * dpr;
    if (cv.width !== w || cv.height !== h) { cv.width = w; cv.height = h; }
    const g = cv.getContext('2d');
    g.clearRect(0, 0, w, h);
    let max = 0;
    for (const d of this.data) for (const v of d) if (v !== null && v > max) max = v;
    const label = this.top ?? max;
    max = this.top ?? (max > 0 ? max * 1.1 : 1);
    const fg = getComputedStyle(document.body).color;
    g.strokeStyle = fg;
    g.globalAlpha = 0.15;
    g.beginPath();
    for (let k = 0; k <= 4; k++) { const y = (h * k) / 4; g.moveTo(0, y); g.lineTo(w, y); }
    g.stroke();
    g.globalAlpha = 1;
    this.data.forEach((d, i) => {
      g.strokeStyle = COLORS[i % COLORS.length];
      g.lineWidth = 2 * dpr;
      g.beginPath();
      let pen = false;
      const dots = [];
      d.forEach((v, k) => {
        const x = (w * (k + KEEP - d.length)) / (KEEP - 1), y = h - (h * (v ?? 0)) / max;
        if (v === null) { pen = false; return; }
        if (pen) g.lineTo(x, y); else g.moveTo(x, y);
        if (!pen && (k + 1 >= d.length || d[k + 1] === null)) dots.push([x, y]); // a lone sample
        pen = true;
      });
      g.stroke();
      g.fillStyle = g.strokeStyle;
      for (const [x, y] of dots) { g.beginPath(); g.arc(x, y, 2.5 * dpr, 0, 2 * Math.PI); g.fill(); }
    });
    g.fillStyle = fg;
    g.font = `${11 * dpr}px system-ui`;
    g.fillText(this.fmt(label), 4 * dpr, 12 * dpr);
    if (this.legend) {
      this.legend.replaceChildren();
      this.data.forEach((d, i) => {
        const s = Strata.el('span'), sw = Strata.el('i');
        sw.style.background = COLORS[i % COLORS.length];
        const last = d.length ? d[d.length - 1] : null;
        s.append(sw, `${this.names[i]}: ${last === null ? '–' : this.fmt(last)}`);
        this.legend.append(s);
      });
    }
  }
}

const plots = {
  tok: new Plot('p-tok', ['decode', 'prefill']),
  ttft: new Plot('p-ttft', ['TTFT']),
  q: new Plot('p-q', ['running', 'queued', 'active here']),
};
const workers = new Map(); // name -> {card, plots}

const pct = (v) => `${(100 * v).toFixed(1)}%`;
const gib = (v) => `${(v / 1073741824).toFixed(2)} GiB`;

function workerCard(w) {
  let c = workers.get(w.name);
  if (c) return c;
  const card = Strata.el('div', 'card');
  card.dataset.worker = w.name;
  const h = Strata.el('h2');
  const sub = Strata.el('span', 'muted');
  h.append(`worker ${workers.size} `, sub);
  card.append(h);
  const mk = (title, id, names, fmt, top) => {
    card.append(Strata.el('div', 'muted', title));
    const cv = Strata.el('canvas', 'plot');
    cv.id = id;
    cv.style.height = '6em';
    const lg = Strata.el('div', 'legend');
    lg.id = id.replace(/^p-/, 'l-');
    card.append(cv, lg);
    return () => new Plot(id, names, fmt, top);
  };
  const n = workers.size;
  const makers = [
    mk('Expert cache and copy link', `p-w${n}-cache`, ['hit rate', 'occupancy', 'copy link busy'], pct, 1),
    mk('Swaps per window', `p-w${n}-swaps`, ['swaps / window']),
    mk('Memory', `p-w${n}-mem`, ['in use', 'total'], gib),
  ];
  $('grid').insertBefore(card, $('heat').closest('.card'));
  c = { card, sub, plots: makers.map((m) => m()) };
  workers.set(w.name, c);
  return c;
}

function per(a, b, k) { return b && a ? (a[k] ?? 0) - (b[k] ?? 0) : null; }

function drawWorker(w, p) {
  const c = workerCard(w);
  const dt = p ? (w.uptime_s ?? 0) - (p.uptime_s ?? 0) : 0;
  // what answering this page costs the worker: a share of its window time while it computes,
  // else milliseconds per second of wall time
  const mon = per(w, p, 'monitor_s'), win = per(w, p, 'window_s');
  const cost = mon === null ? '' : win > 0.1 ? `, monitor ${pct(mon / win)} of window time`
    : dt > 0 ? `, monitor ${((1000 * mon) / dt).toFixed(2)} ms/s` : '';
  c.sub.textContent = `${w.ready ? '' : 'NOT READY · '}${w.backend || '?'}, KV ${w.kv_type || '?'}` +
    `, ${w.tok_s?.toFixed(1) ?? 0} tok/s${cost}`;
  const pairs = per(w, p, 'cache_hits') + per(w, p, 'cache_misses');
  const hit = pairs > 0 ? per(w, p, 'cache_hits') / pairs : w.cache_hit_rate ?? null;
  const occ = w.cache_slots ? (w.cache_resident ?? 0) / w.cache_slots : 0;
  const copyS = (x) => (x && x.cache_copy_gibs > 0 ? x.cache_copy_bytes / (x.cache_copy_gibs * 1073741824) : 0);
  const link = p && dt > 0 ? Math.max(0, copyS(w) - copyS(p)) / dt : null;
  const wins = per(w, p, 'windows');
  const swaps = wins > 0 ? per(w, p, 'cache_swaps') / wins : p ? 0 : null;
  const v = w.vram || {};
  const used = v.total_bytes ? v.total_bytes - v.free_bytes
    : (v.weights_bytes ?? 0) + (v.kv_bytes ?? 0) + (v.cache_bytes ?? 0);
  c.plots[0].push([hit, occ, link]);
  c.plots[1].push([swaps]);
  c.plots[2].push([used, v.total_bytes || null]);
}

// The heat map: counts summed over the workers; recent = now minus HEAT_SPAN samples ago.
function drawHeat(s) {
  let nl = 0, ne = 0, sum = null;
  for (const w of s.workers) {
    const h = w.heat;
    if (!h) continue;
    if (!sum) { nl = h.n_layer; ne = h.n_expert; sum = new Float64Array(nl * ne); }
    if (h.n_layer !== nl || h.n_expert !== ne) continue;
    h.counts.forEach((row, l) => row.forEach((v, e) => { sum[l * ne + e] += v; }));
  }
  const cv = $('heat');
  if (!sum) { $('heat-info').textContent = 'no routing counts (a dense model, or no worker answered)'; return; }
  heatRing.push(sum);
  if (heatRing.length > HEAT_SPAN + 1) heatRing.shift();
  const all = $('heat-all').checked, base = all ? null : heatRing[0];
  const cell = new Float64Array(nl * ne);
  let total = 0;
  for (let i = 0; i < cell.length; i++) { cell[i] = sum[i] - (base ? base[i] : 0); total += cell[i]; }
  let grand = 0;
  for (const v of sum) grand += v;
  cv.dataset.total = String(grand);
  cv.dataset.recent = String(total);
  $('heat-info').textContent = `${nl} layers × ${ne} experts, ${total.toLocaleString()} tokens routed ` +
    (all ? 'since start' : `in the last ${heatRing.length - 1} s`);
  const px = Math.max(2, Math.min(40, Math.floor(cv.parentElement.clientWidth / ne)));
  cv.width = ne * px;
  cv.height = nl * px;
  cv.style.height = `${nl * px}px`;
  cv.style.width = `${ne * px}px`;
  const g = cv.getContext('2d');
  for (let l = 0; l < nl; l++) {
    let rowMax = 0;
    for (let e = 0; e < ne; e++) rowMax = Math.max(rowMax, cell[l * ne + e]);
    for (let e = 0; e < ne; e++) {
      const t = rowMax > 0 ? cell[l * ne + e] / rowMax : 0; // each layer by its own hottest expert
      g.fillStyle = `hsl(${240 - 240 * t}, 80%, ${15 + 45 * Math.sqrt(t)}%)`;
      g.fillRect(e * px, l * px, px, px);
    }
  }
  cv.onmousemove = (ev) => {
    const e = Math.floor(ev.offsetX / px), l = Math.floor(ev.offsetY / px);
    if (l < nl && e < ne) cv.title = `layer ${l}, expert ${e}: ${cell[l * ne + e]} tokens`;
  };
}

function update(s) {
  $('model').textContent = s.model ? `${s.model.id}, ${s.workers.length} worker${s.workers.length === 1 ? '' : 's'}` : 'no model yet';
  $('updated').textContent = new Date(s.time * 1000).toLocaleTimeString();
  const sumOf = (k) => s.workers.reduce((a, w) => a + (w[k] ?? 0), 0);
  plots.tok.push([sumOf('tok_s'), sumOf('prefill_tok_s')]);
  const f = s.frontend, pf = prev?.frontend;
  const dn = pf ? f.ttft_n - pf.ttft_n : 0;
  plots.ttft.push([dn > 0 ? (f.ttft_us - pf.ttft_us) / dn / 1000 : null]);
  plots.q.push([sumOf('running'), sumOf('queued'), f.active]);
  const pw = new Map((prev?.workers ?? []).map((w) => [w.name, w]));
  for (const w of s.workers) drawWorker(w, pw.get(w.name));
  drawHeat(s);
  prev = s;
  document.body.dataset.samples = String(Number(document.body.dataset.samples || 0) + 1);
}

async function poll() {
  const t0 = performance.now();
  try {
    const res = await Strata.api('/status', { cache: 'no-store' });
    if (res.ok) {
      update(await res.json());
      Strata.connBack();
    } else {
      $('model').textContent = await Strata.errorText(res);
    }
  } catch (e) {
    Strata.connLost(e.message);
  }
  setTimeout(poll, Math.max(0, 1000 - (performance.now() - t0)));
}

document.addEventListener('DOMContentLoaded', () => {
  if (started) return;
  started = true;
  $('heat-all').onchange = () => { if (prev) { heatRing.pop(); drawHeat(prev); } };
  window.addEventListener('resize', () => Object.values(plots).forEach((p) => p.draw()));
  poll();
});
