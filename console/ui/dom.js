// Small helpers: building elements node by node (no value from the cluster is ever parsed
// as markup), formatting quantities, colouring jobs.

// h builds an element: h('td', {class: 'num', title: 't'}, 'text', child, ...).
// Attributes named on* take a function; dataset: {...} sets data-*; text children are
// text nodes; null, undefined and false children are skipped.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'class') el.className = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// clear empties an element and fills it with children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const units = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12 };

// bytes reads a quantity as the API writes it ("256Mi", "1288490160", 0).
export function bytes(q) {
  if (typeof q === 'number') return q;
  if (!q) return 0;
  const m = /^([0-9.]+)([A-Za-z]*)$/.exec(q);
  if (!m) return 0;
  return parseFloat(m[1]) * (units[m[2]] || 1);
}

// fmtBytes writes a size in binary units with at most one decimal.
export function fmtBytes(n) {
  if (!n) return '0';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (n >= 10 || i === 0 ? Math.round(n) : Math.round(n * 10) / 10) + ' ' + u[i];
}

// ago writes how long ago a time was ("3m ago").
export function ago(t) {
  const ms = Date.now() - new Date(t).getTime();
  if (!isFinite(ms) || new Date(t).getFullYear() < 2000) return '-';
  return dur(Math.max(ms, 0)) + ' ago';
}

// dur writes a duration in ms briefly ("850ms", "12s", "3m", "5h", "2d").
export function dur(ms) {
  if (ms < 1000) return Math.round(ms) + 'ms';
  const s = ms / 1000;
  if (s < 90) return (s < 10 ? Math.round(s * 10) / 10 : Math.round(s)) + 's';
  if (s < 5400) return Math.round(s / 60) + 'm';
  if (s < 129600) return Math.round(s / 3600) + 'h';
  return Math.round(s / 86400) + 'd';
}

// jobOf is the job a cell belongs to: a router ("wc.router") belongs to its job.
export function jobOf(name) {
  return name.endsWith('.router') ? name.slice(0, -'.router'.length) : name;
}

const hues = new Map();

// colour gives every job a stable colour from its name.
export function colour(job) {
  let hue = hues.get(job);
  if (hue === undefined) {
    let x = 2166136261;
    for (let i = 0; i < job.length; i++) { x ^= job.charCodeAt(i); x = Math.imul(x, 16777619); }
    hue = ((x >>> 0) % 360);
    hues.set(job, hue);
  }
  return `hsl(${hue} 62% 48%)`;
}

// plural writes a count with its noun: plural(1, 'worker') is '1 worker'.
export function plural(n, noun) {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

// badge is a small label; kind is ok, warn, bad or info.
export function badge(text, kind, title) {
  return h('span', { class: 'badge' + (kind ? ' ' + kind : ''), title }, text);
}

// healthBadge shows a node's health.
export function healthBadge(health) {
  const kind = { healthy: 'ok', throttled: 'warn', unhealthy: 'bad', lost: 'bad' }[health] || '';
  return badge(health, kind);
}

// table builds a table from column headers and rows of cells; a header starting with '#'
// is numeric (right-aligned).
export function table(headers, rows, caption) {
  const head = h('tr', null, headers.map((t) => t.startsWith('#') ? h('th', { class: 'num', scope: 'col' }, t.slice(1)) : h('th', { scope: 'col' }, t)));
  const body = rows.map((r) => h('tr', r.attrs || null, r.cells.map((c, i) => {
    const num = headers[i] && headers[i].startsWith('#');
    return c instanceof Node && c.tagName === 'TD' ? c : h('td', num ? { class: 'num' } : null, c);
  })));
  return h('table', null, caption ? h('caption', { class: 'muted' }, caption) : null, h('thead', null, head), h('tbody', null, body));
}

// bar is a small usage bar of used over max (no bar when max is 0: no limit).
export function bar(used, max, text) {
  if (!max) return h('span', null, text, h('span', { class: 'muted' }, ' (no limit)'));
  const pct = Math.min(100, Math.round((used / max) * 100));
  const inner = h('span');
  inner.style.width = pct + '%';
  return h('span', null, h('span', { class: 'bar' + (used > max ? ' over' : ''), role: 'img', 'aria-label': pct + '%' }, inner), text);
}
