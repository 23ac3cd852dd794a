// The cluster's events, live: the Events page (filters by job, node, data center, kind and
// age), and the recent events on a job's and a node's page. Each is one followed
// GET /v1/events stream that resumes after its last event when it breaks; a tenant's token
// gets its own jobs' events alone (the master filters). Rows are drawn by a virtual list, so
// ten thousand events cost a few dozen elements.

import { h, fill, badge } from './dom.js';
import { VirtualList } from './vlist.js';

// KINDS are the event kinds (docs/events-and-logs.md) offered in the kind filter, after
// the prefixes that take a whole family.
export const KINDS = ['job.', 'worker.', 'node.', 'dc.', 'link.', 'rollout.', 'api.call',
  'job.submitted', 'job.updated', 'job.scaled', 'job.killed', 'job.removed',
  'worker.placed', 'worker.started', 'worker.exited', 'worker.restarted', 'worker.crash-looping', 'worker.failed',
  'worker.evicted', 'worker.moved', 'worker.stopped', 'worker.unplaced', 'worker.rolled-out',
  'node.registered', 'node.lost', 'node.back', 'node.throttled', 'node.unhealthy', 'node.healthy', 'node.drained',
  'node.undrained', 'node.avoid-ended', 'dc.lost', 'dc.failed', 'dc.restored', 'link.failover',
  'rollout.step', 'rollout.failed', 'rollout.reverted', 'master.leading', 'events.dropped'];

// FILTERS are the filters the page offers, as GET /v1/events names them.
export const FILTERS = ['job', 'node', 'dc', 'kind', 'since'];

const ROW = 24;
// MAX bounds the events a view holds: the masters keep 10,000 by default.
const MAX = 20000;
// FIRST is how many of the newest kept events a view draws before it reads the rest.
const FIRST = 1000;

const bad = new Set(['worker.exited', 'worker.crash-looping', 'worker.failed', 'worker.evicted', 'worker.unplaced', 'node.lost',
  'node.unhealthy', 'dc.lost', 'dc.failed', 'rollout.failed', 'events.dropped']);
const warn = new Set(['worker.restarted', 'worker.moved', 'node.throttled', 'node.drained', 'link.failover', 'rollout.reverted', 'job.killed']);

function kindBadge(kind) {
  return badge(kind, bad.has(kind) ? 'bad' : warn.has(kind) ? 'warn' : kind.startsWith('rollout.') || kind === 'api.call' ? 'info' : '');
}

// when writes an event's time: the time of day for today's, with the date for older ones.
function when(t) {
  const d = new Date(t);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  const day = d.toDateString() === new Date().toDateString() ? '' : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `;
  return `${day}${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// objectLink links an event's object to its page: a job (or a worker's job), a node.
function objectLink(e) {
  const [kind] = e.object.split('/');
  let href = '';
  if ((kind === 'job' || kind === 'worker' || kind === 'link') && e.job) href = '#/job/' + encodeURIComponent(e.job.replace(/\.router$/, ''));
  else if (kind === 'node' && e.node) href = '#/node/' + encodeURIComponent(e.node);
  else if (kind === 'dc') href = '#/dcs';
  return href ? h('a', { href }, e.object) : h('span', null, e.object);
}

function where(e) {
  if (e.to) return `${e.node || '-'} → ${e.to}`;
  return e.node || e.dc || '';
}

// EventsView is one live list of events. fixed holds filters the view always applies (a
// job page's job); withFilters draws the filter bar; limit is how many kept events it
// starts from (the newest).
export class EventsView {
  constructor(api, el, { fixed = {}, withFilters = false, limit = 0, onFilters = null, height = '' } = {}) {
    this.api = api;
    this.el = el;
    this.fixed = fixed;
    this.limit = limit;
    this.onFilters = onFilters;
    this.filters = {};
    this.evs = [];
    this.dropped = 0;
    this.stopStream = null;
    this.selected = null;
    this.stats = { received: 0, firstRenderMs: 0, shown: new Map() };
    this.inputs = {};
    const bar = withFilters ? this.filterBar() : null;
    this.status = h('span', { class: 'muted', role: 'status', 'aria-live': 'polite' });
    this.newBtn = h('button', { type: 'button', class: 'quiet', hidden: true, onclick: () => this.list.toEnd() }, 'New events ↓');
    this.box = h('div', { class: 'events-list', tabindex: '0', role: 'list', 'aria-label': 'Events, oldest first' });
    if (height) this.box.style.height = height;
    this.detail = h('div', { class: 'event-detail', 'aria-live': 'polite' });
    fill(el, bar, h('div', { class: 'toolbar' }, this.status, this.newBtn),
      h('div', { class: 'events-head', 'aria-hidden': 'true' }, h('span', null, 'Time'), h('span', null, 'Kind'), h('span', null, 'Object'), h('span', null, 'Where'), h('span', null, 'Reason')),
      this.box, this.detail);
    this.list = new VirtualList(this.box, {
      rowHeight: ROW,
      count: () => this.evs.length,
      row: (i) => this.row(this.evs[i]),
      onScroll: (atEnd) => { if (atEnd) this.newBtn.hidden = true; },
    });
  }

  filterBar() {
    const text = (name, label, list, placeholder) => {
      const input = h('input', { name, list, placeholder: placeholder || 'any', spellcheck: 'false', autocomplete: 'off', size: 14 });
      this.inputs[name] = input;
      return h('label', null, label, ' ', input);
    };
    const since = h('select', { name: 'since' },
      [['', 'any time'], ['5m', 'last 5 minutes'], ['15m', 'last 15 minutes'], ['1h', 'last hour'], ['6h', 'last 6 hours'], ['24h', 'last day']]
        .map(([v, t]) => h('option', { value: v }, t)));
    this.inputs.since = since;
    const form = h('form', { class: 'toolbar filters', role: 'search', 'aria-label': 'Event filters' },
      text('job', 'Job', 'job-names'), text('node', 'Node', 'node-names'), text('dc', 'DC', 'dc-names'),
      text('kind', 'Kind', 'event-kinds'), h('label', null, 'Since ', since),
      h('button', { type: 'submit' }, 'Apply'),
      h('button', { type: 'button', class: 'quiet', onclick: () => this.apply({}) }, 'Clear'));
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const f = {};
      for (const k of FILTERS) if (this.inputs[k].value.trim()) f[k] = this.inputs[k].value.trim();
      this.apply(f);
    });
    since.addEventListener('change', () => form.requestSubmit());
    return [form, h('datalist', { id: 'event-kinds' }, KINDS.map((k) => h('option', { value: k })))];
  }

  // apply follows the events filters take (and the fixed ones), from the kept ones on.
  apply(filters) {
    this.filters = { ...filters };
    for (const k of FILTERS) if (this.inputs[k]) this.inputs[k].value = this.filters[k] || '';
    if (this.onFilters) this.onFilters(this.filters);
    this.start();
  }

  // start reads the kept events the filters take in one answer and draws them, then
  // follows what comes after the last of them.
  async start() {
    this.stop();
    const run = (this.run || 0) + 1;
    this.run = run;
    this.evs = [];
    this.dropped = 0;
    this.selected = null;
    this.detail.replaceChildren();
    this.list.stick = true;
    this.list.refresh();
    this.loaded = false;
    this.setStatus('loading…');
    const q = new URLSearchParams({ ...this.filters, ...this.fixed });
    // The newest FIRST come at once and are drawn; the older ones (up to the view's limit)
    // follow in a second answer, put before them.
    const first = this.limit ? Math.min(this.limit, FIRST) : FIRST;
    q.set('limit', String(first));
    let kept;
    try {
      const t0 = performance.now();
      kept = await this.api.call('GET', '/v1/events?' + q);
      this.stats.readMs = performance.now() - t0;
    } catch (e) {
      if (this.run === run) this.setStatus(e.message, true);
      return;
    }
    if (this.run !== run) return; // filters changed meanwhile
    this.add(kept, true);
    const after = kept.length ? kept[kept.length - 1].id : 0;
    if (kept.length === first && (!this.limit || this.limit > first)) this.older(q, kept[0].id, run);
    // What comes while a burst is drawn is drawn with it, at most once a frame.
    let pending = [];
    let frame = 0;
    // Events of an earlier start (other filters) that were on their way are dropped.
    this.stopStream = this.api.events(q, (e) => {
      if (this.run !== run) return;
      this.stats.received++;
      pending.push(e);
      if (!frame) {
        frame = requestAnimationFrame(() => {
          frame = 0;
          const evs = pending;
          pending = [];
          if (this.run === run) this.add(evs);
        });
      }
    }, (s) => {
      if (this.run !== run) return;
      if (s.live) { this.live = true; this.setStatus(); }
      if (s.down) { this.live = false; this.setStatus('reconnecting… (' + s.down + ')'); }
      if (s.refused) { this.live = false; this.setStatus(s.refused, true); }
    }, after);
  }

  // older reads the kept events before id (up to the view's limit) and puts them first.
  async older(q, id, run) {
    const all = new URLSearchParams(q);
    if (this.limit) all.set('limit', String(this.limit)); else all.delete('limit');
    let evs;
    try {
      evs = await this.api.call('GET', '/v1/events?' + all);
    } catch (e) {
      if (this.run === run) this.setStatus('older events: ' + e.message, true);
      return;
    }
    if (this.run !== run) return;
    const before = evs.filter((e) => e.id < id);
    if (!before.length) return;
    this.evs = before.concat(this.evs);
    if (this.evs.length > MAX) {
      const cut = this.evs.length - MAX;
      this.evs.splice(0, cut);
      this.dropped += cut;
    }
    // A reader scrolled up keeps the rows they read in view.
    if (!this.list.stick) this.box.scrollTop += before.length * ROW;
    this.list.draw(true);
    this.stats.allMs = performance.now();
    performance.mark('stormdock:events-all');
    this.el.dataset.count = String(this.evs.length);
    this.setStatus();
  }

  // stop ends the stream, and a start still reading the kept events.
  stop() {
    this.run = (this.run || 0) + 1;
    if (this.stopStream) this.stopStream();
    this.stopStream = null;
  }

  // add appends events, dropping the oldest beyond MAX; first marks the kept ones, read
  // at the start.
  add(evs, first) {
    if (!evs.length && !first) return;
    const t0 = performance.now();
    const wasAtEnd = this.list.stick;
    for (const e of evs) this.evs.push(e);
    if (this.evs.length > MAX) {
      const cut = this.evs.length - MAX;
      this.evs.splice(0, cut);
      this.dropped += cut;
    }
    this.list.draw(true);
    const now = performance.timeOrigin + performance.now();
    for (const e of evs) this.stats.shown.set(e.id, now);
    if (this.stats.shown.size > 4 * MAX) this.stats.shown.clear();
    if (first) {
      this.loaded = true;
      this.stats.firstRenderMs = performance.now();
      this.stats.firstDrawMs = performance.now() - t0;
      performance.mark('stormdock:events-render');
    } else if (!wasAtEnd) {
      this.newBtn.hidden = false;
    }
    this.el.dataset.count = String(this.evs.length);
    if (this.evs.length) this.el.dataset.last = String(this.evs[this.evs.length - 1].id);
    this.setStatus();
  }

  setStatus(text, isError) {
    if (text) {
      this.status.textContent = text;
      this.status.className = isError ? 'error' : 'muted';
      return;
    }
    const n = this.evs.length;
    this.status.className = 'muted';
    this.status.textContent = `${this.live ? 'live' : 'not live'} · ${n.toLocaleString()} event${n === 1 ? '' : 's'}` +
      (this.dropped ? ` (the ${this.dropped.toLocaleString()} oldest dropped from this page)` : '');
  }

  row(e) {
    const open = h('button', { type: 'button', class: 'link', title: 'Details', onclick: () => this.show(e) }, when(e.time));
    return h('div', { class: 'event' + (this.selected === e.id ? ' selected' : ''), role: 'listitem', dataset: { id: e.id, kind: e.kind } },
      h('span', null, open), h('span', null, kindBadge(e.kind)), h('span', null, objectLink(e)),
      h('span', null, where(e)), h('span', { class: 'reason', title: e.reason || '' }, e.reason || ''));
  }

  show(e) {
    this.selected = e.id;
    this.list.draw(true);
    const fields = [['Time', new Date(e.time).toISOString()], ['Kind', e.kind], ['Object', e.object], ['Reason', e.reason],
      ['Job', e.job], ['Tenant', e.tenant], ['Link', e.link], ['Worker', e.worker], ['Node', e.node], ['Data center', e.dc],
      ['Moved to', e.to && `${e.to}${e.toDc ? ' (' + e.toDc + ')' : ''}`], ['By', e.principal], ['Recorded by master', e.master], ['Id', e.id]];
    fill(this.detail, h('h3', null, 'Event ', e.id),
      h('dl', null, fields.filter(([, v]) => v !== undefined && v !== null && v !== '').map(([k, v]) => [h('dt', null, k), h('dd', null, String(v))])),
      h('button', { type: 'button', class: 'quiet', onclick: () => { this.selected = null; this.detail.replaceChildren(); this.list.draw(true); } }, 'Close'));
  }
}
