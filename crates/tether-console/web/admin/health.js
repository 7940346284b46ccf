// Health at a glance: the page reads /metrics (Prometheus text, this
// origin) every SAMPLE_MS itself and draws the last WINDOW_MS as small SVG
// line charts: requests/s, errors/s (HTTP 5xx), tools/call p99, store
// commit p99 (SQLite), live sessions. Rates and quantiles come from the
// difference between two samples. No library, nothing from elsewhere. When
// /metrics is not served here (--metrics-listen, --no-metrics) the panel
// says so.

import { el, svg, fill } from '/console/admin/dom.js';

const SAMPLE_MS = 5000;
const WINDOW_MS = 10 * 60 * 1000;
const MAX_SAMPLES = Math.ceil(WINDOW_MS / SAMPLE_MS) + 1;
/** Bytes of /metrics read at most (its size grows with upstreams, not with load). */
const MAX_METRICS_BYTES = 4 * 1024 * 1024;

/** Parses Prometheus/OpenMetrics text into [{name, labels, value}]. */
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    }
    const value = Number(m[4]);
    if (Number.isFinite(value) || m[4] === '+Inf') out.push({ name: m[1], labels, value });
  }
  return out;
}

/** What one scrape says: counters and cumulative buckets, summed as the charts need them. */
function reduce(metrics) {
  const s = { requests: 0, errors: 0, live: null, callBuckets: new Map(), commitBuckets: new Map() };
  for (const { name, labels, value } of metrics) {
    if (name === 'tether_http_requests_total') {
      s.requests += value;
      if (String(labels.status).startsWith('5')) s.errors += value;
    } else if (name === 'tether_sessions_live') {
      s.live = value;
    } else if (name === 'tether_request_duration_seconds_bucket' && labels.method === 'tools/call') {
      s.callBuckets.set(labels.le, value);
    } else if (name === 'tether_store_commit_seconds_bucket') {
      s.commitBuckets.set(labels.le, value);
    }
  }
  return s;
}

/** The q-quantile (seconds) of the observations between two cumulative bucket sets; null if none. */
export function quantile(q, before, after) {
  const les = [...after.keys()].map((le) => [le, le === '+Inf' ? Infinity : Number(le)]).sort((a, b) => a[1] - b[1]);
  const counts = les.map(([le, bound]) => [bound, (after.get(le) || 0) - (before?.get(le) || 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (!(total > 0)) return null;
  const rank = q * total;
  let prevBound = 0;
  let prevCount = 0;
  for (const [bound, count] of counts) {
    if (count >= rank) {
      if (!Number.isFinite(bound)) return prevBound;
      const inBucket = count - prevCount;
      return inBucket > 0 ? prevBound + ((bound - prevBound) * (rank - prevCount)) / inBucket : bound;
    }
    prevBound = bound;
    prevCount = count;
  }
  return prevBound;
}

const CHARTS = [
  { key: 'rps', title: 'Requests/s', unit: (v) => v.toFixed(v < 10 ? 2 : 0) },
  { key: 'eps', title: 'Errors/s (HTTP 5xx)', unit: (v) => v.toFixed(v < 10 ? 2 : 0), bad: true },
  { key: 'callP99', title: 'tools/call p99', unit: ms },
  { key: 'commitP99', title: 'Store commit p99', unit: ms },
  { key: 'live', title: 'Live sessions', unit: (v) => String(Math.round(v)) },
];

function ms(seconds) {
  const v = seconds * 1000;
  return v < 10 ? `${v.toFixed(2)} ms` : v < 1000 ? `${v.toFixed(0)} ms` : `${(v / 1000).toFixed(2)} s`;
}

export class Health {
  constructor(root, note) {
    this.root = root;
    this.note = note;
    this.samples = []; // {t, rps, eps, callP99, commitP99, live}
    this.last = null;
    this.timer = null;
    this.cards = new Map();
    for (const c of CHARTS) {
      const value = el('span', { class: 'value', text: '–' });
      const plot = el('div', { class: 'plot' });
      const card = el('figure', { class: 'chart', dataset: { chart: c.key } }, el('figcaption', {}, c.title, ' ', value), plot);
      this.cards.set(c.key, { card, value, plot, spec: c });
      root.append(card);
      fill(plot, chart([], Date.now(), c));
    }
  }

  start() {
    this.stop();
    this.sample();
    this.timer = setInterval(() => this.sample(), SAMPLE_MS);
  }

  stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  async sample() {
    let text;
    try {
      const r = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
      if (r.status === 404) {
        this.note.textContent = '/metrics is not served on this address (tether runs with --metrics-listen or --no-metrics): no charts here.';
        this.stop();
        return;
      }
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      text = await r.text();
      if (text.length > MAX_METRICS_BYTES) throw new Error('/metrics is larger than the page reads');
    } catch (e) {
      this.note.textContent = `/metrics could not be read (${e.message}); trying again.`;
      return;
    }
    const now = Date.now();
    const cur = reduce(parseMetrics(text));
    const prev = this.last;
    this.last = { t: now, ...cur };
    this.note.textContent = `from /metrics every ${SAMPLE_MS / 1000} s, the last ${WINDOW_MS / 60000} minutes`;
    if (!prev) {
      for (const { value } of this.cards.values()) value.textContent = 'collecting…';
      return;
    }
    const dt = (now - prev.t) / 1000;
    if (dt <= 0) return;
    // A counter that went down: the server restarted; this interval says nothing.
    const reset = cur.requests < prev.requests;
    this.samples.push({
      t: now,
      rps: reset ? null : (cur.requests - prev.requests) / dt,
      eps: reset ? null : (cur.errors - prev.errors) / dt,
      callP99: reset ? null : quantile(0.99, prev.callBuckets, cur.callBuckets),
      commitP99: reset ? null : quantile(0.99, prev.commitBuckets, cur.commitBuckets),
      live: cur.live,
    });
    while (this.samples.length > MAX_SAMPLES || (this.samples.length && this.samples[0].t < now - WINDOW_MS)) this.samples.shift();
    this.draw(now);
  }

  draw(now) {
    for (const { value, plot, spec } of this.cards.values()) {
      const points = this.samples.map((s) => [s.t, s[spec.key]]);
      const latest = [...points].reverse().find(([, v]) => v !== null && v !== undefined);
      value.textContent = latest ? spec.unit(latest[1]) : 'no data';
      fill(plot, chart(points, now, spec));
    }
  }
}

/** One line chart of [t, v] (null: a gap) over the window ending at `now`. */
function chart(points, now, spec) {
  const W = 240;
  const H = 64;
  const values = points.map(([, v]) => v).filter((v) => v !== null && v !== undefined);
  const max = Math.max(...values, 0) || 1;
  // The window, or less while the page has sampled less: the line spans the chart.
  const start = Math.max(now - WINDOW_MS, (points[0]?.[0] ?? now) - SAMPLE_MS);
  const x = (t) => ((t - start) / Math.max(now - start, 1)) * W;
  const y = (v) => H - 2 - (v / max) * (H - 6);
  const lines = [];
  let run = [];
  for (const [t, v] of points) {
    if (v === null || v === undefined) {
      if (run.length) lines.push(run);
      run = [];
    } else {
      run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    }
  }
  if (run.length) lines.push(run);
  const minutes = Math.max(1, Math.round((now - start) / 60000));
  const title = `${spec.title}: at most ${spec.unit(max)} over the last ${minutes} minute${minutes === 1 ? '' : 's'}`;
  return svg('svg', { viewBox: `0 0 ${W} ${H}`, class: spec.bad ? 'spark bad' : 'spark', role: 'img', 'aria-label': title },
    svg('title', {}, title),
    svg('line', { x1: 0, y1: H - 2, x2: W, y2: H - 2, class: 'axis' }),
    svg('text', { x: 2, y: 10, class: 'max' }, spec.unit(max)),
    lines.map((pts) => (pts.length === 1
      ? svg('circle', { cx: pts[0].split(',')[0], cy: pts[0].split(',')[1], r: 1.5, class: 'dot' })
      : svg('polyline', { points: pts.join(' '), class: 'line' }))));
}
