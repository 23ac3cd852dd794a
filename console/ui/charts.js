// A job's metrics as charts on its page: the series the masters keep (GET
// /v1/jobs/{name}/metrics), drawn here as SVG built node by node (no library, no inline
// script or style: the page's Content-Security-Policy holds), refreshed every step of the
// history. The worker count's chart marks every scaling decision (GET /v1/events).

import { h, fill, fmtBytes } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const W = 400, H = 130, PAD_L = 52, PAD_R = 6, PAD_T = 8, PAD_B = 18;

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children) if (c) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const titles = {
  workers: 'Workers running', cpu: 'CPU (cores)', memory: 'Memory', throughput: 'Throughput (records/s)',
  restarts: 'Restarts (/s)', oom_kills: 'OOM kills (/s)',
};

// fmt writes a value as its series reads best.
export function fmt(series, v) {
  if (v === null || v === undefined || !isFinite(v)) return '-';
  if (series === 'memory') return fmtBytes(v);
  const a = Math.abs(v);
  if (a >= 1000) return Math.round(v).toLocaleString('en');
  if (a >= 10 || Number.isInteger(v)) return String(Math.round(v * 10) / 10);
  return String(Math.round(v * 1000) / 1000);
}

// chart draws one series from point start on (where the page's history begins): its values
// as a line (the sum over the workers, or a counter's rate), and marks at the given times.
export function chart(series, m, start, marks) {
  const name = series.labels ? `${series.name}{${series.labels}}` : series.name;
  const vals = series.values.slice(start);
  const n = vals.length;
  const step = m.step * 1000, from = new Date(m.from).getTime() + start * step;
  let lo = Infinity, hi = -Infinity, last = null, count = 0;
  for (const v of vals) {
    if (v === null) continue;
    lo = Math.min(lo, v); hi = Math.max(hi, v); last = v; count++;
  }
  if (!count) { lo = 0; hi = 1; }
  lo = Math.min(lo, 0);
  if (hi <= lo) hi = lo + 1;
  const x = (i) => PAD_L + (n <= 1 ? 0 : (i / (n - 1)) * (W - PAD_L - PAD_R));
  const y = (v) => PAD_T + (1 - (v - lo) / (hi - lo)) * (H - PAD_T - PAD_B);
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': `${titles[name] || name}: ${fmt(series.name, last)} now` });
  svg.append(s('line', { x1: PAD_L, y1: y(lo), x2: W - PAD_R, y2: y(lo), class: 'axis' }));
  svg.append(s('line', { x1: PAD_L, y1: y(hi), x2: W - PAD_R, y2: y(hi), class: 'grid' }));
  svg.append(s('text', { x: PAD_L - 4, y: y(hi) + 4, class: 'tick', 'text-anchor': 'end' }, fmt(series.name, hi)));
  svg.append(s('text', { x: PAD_L - 4, y: y(lo), class: 'tick', 'text-anchor': 'end' }, fmt(series.name, lo)));
  const short = n * step < 3600e3;
  const time = (i) => new Date(from + i * step).toLocaleTimeString([], short ? { hour: '2-digit', minute: '2-digit', second: '2-digit' } : { hour: '2-digit', minute: '2-digit' });
  svg.append(s('text', { x: PAD_L, y: H - 4, class: 'tick' }, time(0)));
  svg.append(s('text', { x: W - PAD_R, y: H - 4, class: 'tick', 'text-anchor': 'end' }, time(n - 1)));
  // The line, broken where the history has no point.
  let d = '';
  let pen = false;
  for (let i = 0; i < n; i++) {
    const v = vals[i];
    if (v === null) { pen = false; continue; }
    d += `${pen ? 'L' : 'M'}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
    pen = true;
  }
  if (d) svg.append(s('path', { d, class: 'line' }));
  for (const mk of marks || []) {
    const i = (new Date(mk.time).getTime() - from) / step;
    if (i < 0 || i > n - 1) continue;
    const g = s('g', { class: 'mark ' + mk.kind });
    g.append(s('line', { x1: x(i), y1: PAD_T, x2: x(i), y2: H - PAD_B }));
    g.append(s('circle', { cx: x(i), cy: PAD_T + 3, r: 3 }));
    g.append(s('title', null, `${new Date(mk.time).toLocaleTimeString()}: ${mk.reason}`));
    g.dataset.decision = mk.reason;
    svg.append(g);
  }
  return h('figure', { class: 'chart-box', dataset: { series: name, points: String(count) } },
    h('figcaption', null, h('b', null, titles[name] || name), ' ', h('span', { class: 'muted' }, series.kind === 'counter' && !titles[name] ? '(rate /s)' : ''),
      h('span', { class: 'now' }, fmt(series.name, last))),
    svg);
}

// Charts is the charts section of one job's page: it keeps its element across the page's
// redraws (attach puts it back in place) and polls while attached.
export class Charts {
  constructor(api) {
    this.api = api;
    this.name = '';
    this.el = h('section', { class: 'charts', 'aria-label': 'Metrics' });
    this.since = '30m';
    this.timer = 0;
    this.data = null;
    this.marks = [];
    this.error = '';
  }

  // attach shows job name's charts in slot (the job page's placeholder).
  attach(slot, name) {
    if (!slot) return;
    if (name !== this.name) {
      this.stop();
      this.name = name;
      this.data = null;
      this.marks = [];
      this.error = '';
      this.render();
    }
    if (this.el.parentNode !== slot) slot.replaceChildren(this.el);
    if (!this.timer) {
      this.load();
      this.timer = setInterval(() => this.load(), 5000);
    }
  }

  stop() {
    clearInterval(this.timer);
    this.timer = 0;
  }

  async load() {
    const name = this.name;
    const q = encodeURIComponent(name);
    try {
      const [m, evs] = await Promise.all([
        this.api.call('GET', `/v1/jobs/${q}/metrics?since=${this.since}`),
        this.api.call('GET', `/v1/events?job=${q}&limit=500`),
      ]);
      if (name !== this.name) return;
      this.data = m;
      this.marks = (evs || []).filter((e) => e.kind === 'job.autoscaled' || e.kind === 'job.scaled')
        .map((e) => ({ time: e.time, reason: e.reason, kind: e.kind === 'job.autoscaled' ? 'auto' : 'manual' }));
      this.error = '';
      if (m && m.step) {
        // Poll at the history's pace.
        clearInterval(this.timer);
        this.timer = setInterval(() => this.load(), Math.max(m.step * 1000, 2000));
      }
    } catch (e) {
      this.error = e.message;
    }
    this.render();
  }

  render() {
    const head = h('div', { class: 'charts-head' }, h('h3', null, 'Metrics'),
      h('label', null, 'Last ', h('select', {
        onchange: (e) => { this.since = e.target.value; this.load(); },
      }, ['5m', '30m', '1h'].map((v) => h('option', { value: v, selected: v === this.since }, v)))));
    const m = this.data;
    if (this.error) return fill(this.el, head, h('p', { class: 'error' }, this.error));
    if (!m) return fill(this.el, head, h('p', { class: 'muted' }, 'Loading…'));
    if (!m.series.length) return fill(this.el, head, h('p', { class: 'muted' }, `No metrics yet: the masters read the agents every ${m.step}s.`));
    const order = ['throughput', 'cpu', 'memory'];
    const pick = (n) => m.series.find((x) => x.name === n && !x.labels);
    // A history younger than the window starts where its first point is.
    let start = Infinity;
    for (const x of m.series) {
      const i = x.values.findIndex((v) => v !== null);
      if (i >= 0) start = Math.min(start, i);
    }
    if (!isFinite(start)) start = 0;
    start = Math.min(start, Math.max(m.series[0].values.length - 2, 0));
    const charts = [];
    for (const n of order) if (pick(n)) charts.push(chart(pick(n), m, start));
    for (const x of m.series) {
      if (!['workers', 'cpu', 'memory', 'throughput', 'restarts', 'oom_kills'].includes(x.name)) charts.push(chart(x, m, start));
    }
    if (pick('workers')) charts.push(chart(pick('workers'), m, start, this.marks));
    const problems = m.problems && m.problems.length ? h('ul', { class: 'reasons' }, m.problems.map((p) => h('li', null, p))) : null;
    fill(this.el, head, problems, h('div', { class: 'chart-grid' }, charts),
      h('p', { class: 'muted keys' }, 'Gauges are summed over the workers, counters are rates (per second); on the worker count, a mark is a scaling decision (hover it for the numbers).'));
  }
}
