// The console: login, the live state from GET /v1/watch, routing between views, and the
// actions (each confirmed first, each an ordinary API call).

import { API } from './api.js';
import { h, fill, colour } from './dom.js';
import { ClusterMap } from './map.js';
import { Charts } from './charts.js';
import * as views from './views.js';

const TOKEN_KEY = 'stormdock.token';
const $ = (id) => document.getElementById(id);

// S is the cluster as the stream last said, by key.
const S = { version: 0, master: null, viewer: null, dcs: new Map(), nodes: new Map(), jobs: new Map(), tenants: new Map() };
// stats are for whoever measures the console (the tests' figures).
const stats = { events: 0, bytes: 0, lastEventMs: 0, lastApplyMs: 0, firstRenderMs: 0 };
window.stormdockStats = stats;

let api = null;
let stopWatch = null;
let map = null;
let route = { view: 'map', arg: '' };
let pending = null; // changes not drawn yet
let jobState = { name: '', status: null, links: null, timer: 0, loading: false, again: false, loaded: 0 };
let nodeFilter = '';
let charts = null; // the job page's metrics charts (charts.js)

function emptyChanges() {
  return { full: false, master: false, dcs: new Set(), nodes: new Set(), jobs: new Set(), jobsAdded: false, tenants: new Set() };
}

// ---- state from the stream ----

function onEvent(type, msg, size) {
  const t0 = performance.now();
  const ch = pending || emptyChanges();
  if (type === 'snapshot') {
    S.master = msg.master;
    S.viewer = msg.viewer;
    for (const [k, list, key] of [['dcs', msg.dcs, 'name'], ['nodes', msg.nodes, 'id'], ['jobs', msg.jobs, 'name'], ['tenants', msg.tenants, 'name']]) {
      S[k] = new Map(list.map((x) => [x[key], x]));
    }
    ch.full = true;
  } else if (type === 'delta') {
    if (msg.master) { S.master = msg.master; ch.master = true; }
    for (const [k, up, gone, key] of [['dcs', msg.dcs, msg.goneDcs, 'name'], ['nodes', msg.nodes, msg.goneNodes, 'id'],
      ['jobs', msg.jobs, msg.goneJobs, 'name'], ['tenants', msg.tenants, msg.goneTenants, 'name']]) {
      for (const x of up || []) {
        if (k === 'jobs' && !S.jobs.has(x[key])) ch.jobsAdded = true;
        S[k].set(x[key], x);
        ch[k].add(x[key]);
      }
      for (const g of gone || []) {
        S[k].delete(g);
        ch[k].add(g);
        if (k === 'jobs') ch.jobsAdded = true;
      }
    }
  } else {
    return;
  }
  S.version = msg.version;
  stats.events++;
  stats.bytes += size;
  stats.lastEventMs = t0;
  pending = ch;
  // Draw once per frame however many events came; a hidden page draws when shown.
  if (document.hidden) setTimeout(draw, 0); else requestAnimationFrame(draw);
}

function draw() {
  const ch = pending;
  if (!ch) return;
  pending = null;
  const t0 = performance.now();
  header();
  if (ch.full || ch.jobsAdded || ch.jobs.size) jobPickers();
  const v = route.view;
  if (v === 'map') {
    if (ch.full || !map.nodeEls.size) map.full(); else map.update(ch);
    if (map.selected) views.nodePanel($('detail'), S, map.selected, actions);
    summary();
  } else if (v === 'jobs' && (ch.full || ch.jobs.size)) {
    views.jobs($('jobs-table'), S, actions);
  } else if (v === 'job') {
    jobChanged(ch);
  } else if (v === 'nodes' && (ch.full || ch.nodes.size)) {
    views.nodes($('nodes-table'), S, nodeFilter, actions, ch.full ? null : ch.nodes);
  } else if (v === 'dcs' && (ch.full || ch.dcs.size)) {
    views.dcs($('dcs-table'), S, actions);
  } else if (v === 'tenants' && (ch.full || ch.tenants.size)) {
    views.tenants($('tenants-table'), S);
  }
  document.body.dataset.version = S.version;
  stats.lastApplyMs = performance.now() - t0;
  if (!stats.firstRenderMs && v === 'map') {
    stats.firstRenderMs = performance.now();
    performance.mark('stormdock:first-render');
  }
}

function header() {
  const m = S.master;
  if (m) {
    fill($('master'), 'master ', h('code', null, m.id), ' ', h('span', { class: 'badge ' + (m.leader ? 'ok' : 'info') }, m.leader ? 'leader' : 'standby'));
    $('store-warning').hidden = !m.store;
    $('store-warning').textContent = m.store || '';
  }
  const vw = S.viewer;
  if (vw) fill($('viewer'), vw.admin ? h('span', { class: 'badge ok' }, 'admin') : ['tenant ', h('span', { class: 'badge info' }, vw.tenant)]);
  document.body.classList.toggle('is-admin', !!(vw && vw.admin));
}

function summary() {
  let workers = 0, slots = 0, free = 0, withheld = 0;
  for (const n of S.nodes.values()) {
    if (n.state === 'lost') continue;
    workers += n.cells.length;
    slots += n.slots;
    const w = Math.min(n.throttled || 0, Math.max(n.slots - n.cells.length, 0));
    withheld += w;
    if (!n.draining) free += Math.max(n.slots - n.cells.length - w, 0);
  }
  const parts = [`${S.nodes.size} nodes · ${workers} workers · ${free} of ${slots} slots free` + (withheld ? ` · ${withheld} withheld` : '')];
  if (map.highlight) {
    let cells = 0;
    const on = new Set();
    for (const n of S.nodes.values()) {
      for (const c of n.cells) if (c[0] === map.highlight || c[0] === map.highlight + '.router') { cells++; on.add(n.id); }
    }
    parts.push(` · job ${map.highlight}: ${cells} workers on ${on.size} nodes`);
  }
  $('map-summary').textContent = parts.join('');
  $('map-summary').dataset.highlighted = map.highlight ? String(map.root.querySelectorAll('.cell.hl').length) : '';
}

// jobPickers fills the map's legend, the job suggestions and the tenant filter.
function jobPickers() {
  const jobs = [...S.jobs.values()].sort((a, b) => a.name.localeCompare(b.name));
  fill($('job-names'), jobs.map((j) => h('option', { value: j.name })));
  fill($('legend'), jobs.map((j) => {
    const sw = h('span', { class: 'swatch', 'aria-hidden': 'true' });
    sw.style.background = colour(j.name);
    return h('button', {
      type: 'button', 'aria-pressed': String(map.highlight === j.name), dataset: { job: j.name },
      title: `${j.tenant}: ${j.running} of ${j.workers} running`, onclick: () => highlight(map.highlight === j.name ? '' : j.name),
    }, sw, `${j.name} ${j.running}/${j.workers}`);
  }));
  const sel = $('filter-tenant');
  const cur = sel.value;
  const tenants = [...new Set(jobs.map((j) => j.tenant))].sort();
  fill(sel, h('option', { value: '' }, 'any'), tenants.map((t) => h('option', { value: t }, t)));
  sel.value = tenants.includes(cur) ? cur : '';
}

function highlight(job) {
  map.setHighlight(job);
  for (const b of $('legend').querySelectorAll('button')) b.setAttribute('aria-pressed', String(b.dataset.job === job));
  summary();
}

// ---- the job page ----

function jobChanged(ch) {
  const name = route.arg;
  let touched = ch.full || ch.jobs.has(name);
  if (!touched) {
    for (const id of ch.nodes) {
      const n = S.nodes.get(id);
      if (!n || n.cells.some((c) => c[0] === name || c[0] === name + '.router')) { touched = true; break; }
    }
  }
  if (touched) loadJob();
  renderJob();
}

function renderJob() {
  views.job($('view-job'), S, route.arg, jobState.status, jobState.links, actions);
  if (S.jobs.has(route.arg)) {
    charts = charts || new Charts(api);
    charts.attach($('view-job').querySelector('.charts-slot'), route.arg);
  }
}

// loadJob fetches the job's workers: at once, or again once the fetch under way is done.
async function loadJob() {
  if (jobState.loading) { jobState.again = true; return; }
  jobState.loading = true;
  const name = route.arg;
  try {
    const st = await api.call('GET', '/v1/jobs/' + encodeURIComponent(name));
    if (route.view === 'job' && route.arg === name) jobState.status = st;
  } catch (e) {
    if (route.view === 'job' && route.arg === name) jobState.status = { error: e.message };
  }
  jobState.loaded = Date.now();
  jobState.loading = false;
  if (route.view === 'job' && route.arg === name) renderJob();
  if (jobState.again) { jobState.again = false; loadJob(); }
}

// jobBehind reports whether the workers shown are due a new fetch. The map's stream is built
// from the store as it changes; a job's workers come from the leader's last reconcile, a
// moment behind. A fetch in that moment shows what the map no longer does, and nothing on
// the stream would fetch again: so the page asks again while the two disagree, and every
// few seconds anyway (memory and restarts change without a word on the stream).
function jobBehind() {
  const j = S.jobs.get(route.arg);
  const st = jobState.status;
  if (!j || !st || jobState.loading) return false;
  if (st.error || !st.summary) return true;
  if (st.summary.running !== j.running || st.summary.workers !== j.workers || st.summary.generation !== j.generation) return true;
  return Date.now() - jobState.loaded >= 5000;
}

function jobTick() {
  pollLinks();
  if (jobBehind()) loadJob();
}

// pollLinks asks the router every second: lag and heartbeat ages change all the time.
async function pollLinks() {
  const name = route.arg;
  const j = S.jobs.get(name);
  if (route.view !== 'job' || !j || !j.links) return;
  try {
    jobState.links = await api.call('GET', '/v1/jobs/' + encodeURIComponent(name) + '/links');
  } catch (e) {
    jobState.links = { failed: e.message };
  }
  if (route.view === 'job' && route.arg === name) renderJob();
}

// ---- routing ----

function go() {
  const m = /^#\/([a-z]+)(?:\/(.*))?$/.exec(location.hash);
  route = { view: m ? m[1] : 'map', arg: m && m[2] ? decodeURIComponent(m[2]) : '' };
  if (!['map', 'jobs', 'job', 'nodes', 'dcs', 'tenants'].includes(route.view)) route.view = 'map';
  for (const s of document.querySelectorAll('.view')) s.hidden = s.id !== 'view-' + route.view;
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.view === route.view || (route.view === 'job' && a.dataset.view === 'jobs')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  clearInterval(jobState.timer);
  if (charts && route.view !== 'job') charts.stop();
  if (route.view === 'job') {
    if (jobState.name !== route.arg) jobState = { name: route.arg, status: null, links: null, timer: 0, loading: false, again: false, loaded: 0 };
    jobState.timer = setInterval(jobTick, 1000);
    pollLinks();
    loadJob();
  }
  if (S.viewer) {
    pending = pending || emptyChanges();
    pending.full = true;
    draw();
  }
}

// ---- actions ----

function toast(text, bad) {
  const t = $('toast');
  t.textContent = text;
  t.classList.toggle('bad', !!bad);
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 5000);
}

// confirmAction asks first: title, text, fields [{name, label, type, value, min, options}],
// ok (the button), danger; run(values) does it and may throw (the dialog then shows why).
function confirmAction({ title, text, fields = [], ok, danger, run, done }) {
  const dlg = $('confirm');
  $('confirm-title').textContent = title;
  $('confirm-text').textContent = text;
  $('confirm-error').hidden = true;
  const inputs = {};
  fill($('confirm-fields'), fields.map((f) => {
    let input;
    if (f.type === 'select') {
      input = h('select', { name: f.name }, f.options.map(([v, label]) => h('option', { value: v }, label)));
      input.value = f.value;
    } else if (f.type === 'checkbox') {
      input = h('input', { type: 'checkbox', name: f.name });
      input.checked = !!f.value;
    } else {
      input = h('input', { type: f.type || 'text', name: f.name, value: f.value, min: f.min, required: f.required });
    }
    inputs[f.name] = input;
    return h('label', null, f.type === 'checkbox' ? [input, ' ', f.label] : [f.label, ' ', input]);
  }));
  const okBtn = $('confirm-ok');
  okBtn.textContent = ok;
  okBtn.className = danger ? 'danger' : '';
  okBtn.disabled = false;
  $('confirm-form').onsubmit = async (e) => {
    e.preventDefault();
    const values = {};
    for (const [k, el] of Object.entries(inputs)) values[k] = el.type === 'checkbox' ? el.checked : el.value;
    okBtn.disabled = true;
    try {
      const res = await run(values);
      dlg.close();
      toast(done ? done(res, values) : 'Done.');
    } catch (err) {
      $('confirm-error').textContent = err.message;
      $('confirm-error').hidden = false;
      okBtn.disabled = false;
    }
  };
  $('confirm-cancel').onclick = () => dlg.close();
  dlg.showModal();
  const first = Object.values(inputs)[0];
  (first || $('confirm-cancel')).focus();
}

const enc = encodeURIComponent;

const actions = {
  get admin() { return !!(S.viewer && S.viewer.admin); },
  scale(j) {
    confirmAction({
      title: `Scale ${j.name}`,
      text: `It runs ${j.running} of ${j.workers} workers${j.links ? ' (per link: ' + j.workers / j.links.length + ')' : ''}. Workers that stay are not restarted; scaling in stops the highest indexes.`,
      fields: [{ name: 'workers', label: j.links ? 'Workers per link' : 'Workers', type: 'number', min: 1, value: j.links ? j.workers / j.links.length : j.workers, required: true }],
      ok: 'Scale',
      run: (v) => {
        const n = Number(v.workers);
        if (!Number.isInteger(n) || n < 1) throw new Error('workers must be a whole number of at least 1');
        return api.call('POST', `/v1/jobs/${enc(j.name)}/scale`, { workers: n });
      },
      done: (rec) => `Job ${j.name} scaled to ${rec.spec.workers} workers.`,
    });
  },
  kill(j) {
    confirmAction({
      title: `Kill ${j.name}`,
      text: `Every worker of ${j.name} stops (SIGTERM, then SIGKILL after the grace period) and the job is removed.`,
      fields: [{ name: 'grace', label: 'Grace period (empty: the job\'s own)', value: '', type: 'text' }],
      ok: 'Kill', danger: true,
      run: (v) => api.call('POST', `/v1/jobs/${enc(j.name)}/kill`, v.grace ? { grace: v.grace } : {}),
      done: () => `Job ${j.name} is being stopped.`,
    });
  },
  drain(n, on) {
    confirmAction({
      title: `${on ? 'Drain' : 'Undrain'} ${n.id}`,
      text: on ? `Its ${n.cells.length} workers move to other nodes and it takes no new ones.` : 'It takes new workers again (and the jobs noted for crash loops there may return).',
      ok: on ? 'Drain' : 'Undrain', danger: on,
      run: () => api.call('POST', `/v1/nodes/${enc(n.id)}/${on ? 'drain' : 'undrain'}`),
      done: () => `Node ${n.id} ${on ? 'draining' : 'takes work again'}.`,
    });
  },
  dc(d, fail) {
    const f = d.ifFailed;
    confirmAction({
      title: `${fail ? 'Fail' : 'Restore'} data center ${d.name}`,
      text: fail
        ? `Its ${d.workers} workers move to the other data centers, whole jobs by priority.` + (f ? (f.fits ? ' The placement engine finds room for all of them.' : ` The placement engine finds no room for ${f.waiting} of them: their jobs would wait.`) : '')
        : 'New work may go into it again.',
      fields: fail ? [] : [{ name: 'rebalance', label: 'Rebalance: spread jobs back into it once', type: 'checkbox', value: false }],
      ok: fail ? 'Fail' : 'Restore', danger: fail,
      run: (v) => api.call('POST', `/v1/dcs/${enc(d.name)}/${fail ? 'fail' : 'restore'}`, fail ? undefined : { rebalance: !!v.rebalance }),
      done: () => `Data center ${d.name} ${fail ? 'failed' : 'restored'}.`,
    });
  },
  failover(j, links) {
    const standby = (links.links || []).filter((l) => !l.active).map((l) => [l.link, `${l.link}${l.alive ? '' : ' (down)'}`]);
    confirmAction({
      title: `Fail over ${j.name}`,
      text: `The router switches its output from ${links.active || 'no link'} to another link, continuing from the first offset not yet delivered.`,
      fields: [{ name: 'to', label: 'To', type: 'select', value: '', options: [['', 'the most advanced live standby'], ...standby] }],
      ok: 'Fail over', danger: true,
      run: (v) => api.call('POST', `/v1/jobs/${enc(j.name)}/failover`, v.to ? { to: v.to } : {}),
      done: (st) => {
        jobState.links = st;
        pollLinks();
        return `Job ${j.name}: active link ${st.active}.`;
      },
    });
  },
  showOnMap(job) {
    location.hash = '#/map';
    highlight(job);
  },
  showNode(id) {
    location.hash = '#/map';
    openNode(id);
    const el = map.nodeEls.get(id);
    if (el) { el.scrollIntoView({ block: 'center' }); el.focus(); }
  },
};

function openNode(id) {
  map.setSelected(id);
  const d = $('detail');
  d.hidden = false;
  views.nodePanel(d, S, id, actions);
}

// ---- login ----

function showLogin(msg) {
  $('app').hidden = true;
  $('login').hidden = false;
  const e = $('login-error');
  e.hidden = !msg;
  e.textContent = msg ? 'Token refused: ' + msg : '';
  $('token').focus();
}

function start(token, fromForm) {
  if (stopWatch) stopWatch();
  if (charts) { charts.stop(); charts = null; }
  api = new API(token);
  let shown = false;
  stopWatch = api.watch((type, msg, size) => {
    if (!shown) {
      shown = true;
      sessionStorage.setItem(TOKEN_KEY, token);
      $('login').hidden = true;
      $('app').hidden = false;
      if (fromForm) $('main').focus();
    }
    onEvent(type, msg, size);
  }, (s) => {
    const c = $('conn');
    if (s.live) { c.className = 'conn live'; c.textContent = 'live'; }
    if (s.down) { c.className = 'conn down'; c.textContent = 'reconnecting…'; c.title = s.down; }
    if (s.refused) {
      sessionStorage.removeItem(TOKEN_KEY);
      stopWatch = null;
      showLogin(s.refused);
    }
  });
}

function init() {
  map = new ClusterMap($('map'), S, openNode, (job) => highlight(job));
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = $('token').value.trim();
    if (t) start(t, true);
  });
  $('logout').addEventListener('click', () => {
    if (stopWatch) stopWatch();
    stopWatch = null;
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  const applyFilter = () => map.setFilter({ job: $('filter-job').value.trim(), tenant: $('filter-tenant').value });
  $('filter-job').addEventListener('input', applyFilter);
  $('filter-tenant').addEventListener('change', applyFilter);
  $('filter-clear').addEventListener('click', () => {
    $('filter-job').value = '';
    $('filter-tenant').value = '';
    applyFilter();
    highlight('');
  });
  $('nodes-filter').addEventListener('input', (e) => {
    nodeFilter = e.target.value;
    views.nodes($('nodes-table'), S, nodeFilter, actions);
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === '/' && !/INPUT|SELECT|TEXTAREA/.test(document.activeElement.tagName) && route.view === 'map') {
      e.preventDefault();
      $('filter-job').focus();
    }
  });
  window.addEventListener('hashchange', go);
  // A page kept in the back/forward cache holds no stream; it starts a new one when shown.
  window.addEventListener('pagehide', () => { if (stopWatch) stopWatch(); stopWatch = null; });
  window.addEventListener('pageshow', (e) => {
    const t = sessionStorage.getItem(TOKEN_KEY);
    if (e.persisted && t) start(t, false);
  });
  go();
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) start(token, false); else showLogin('');
}

init();
