// The console: login, the live state from GET /v1/watch, routing between views, and the
// actions (each confirmed first, each an ordinary API call).

import { API } from './api.js';
import { h, fill, colour } from './dom.js';
import { ClusterMap } from './map.js';
import * as views from './views.js';
import { JobPage } from './jobpage.js';
import { NodePage } from './nodepage.js';
import { EventsView, FILTERS } from './events.js';

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
let route = { view: 'map', arg: '', sub: '', params: new URLSearchParams() };
let pending = null; // changes not drawn yet
let jobState = { name: '', status: null, links: null, timer: 0, loading: false, again: false, loaded: 0 };
let nodeFilter = '';
let jobPage = null;
let nodePage = null;
let eventsPage = null;

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
  if (ch.full || ch.dcs.size || S.nodes.size !== placePickers.nodes) placePickers();
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
  } else if (v === 'node' && (ch.full || ch.nodes.has(route.arg))) {
    nodePage.draw();
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

// placePickers fills the node and data-center suggestions of the event filters.
function placePickers() {
  placePickers.nodes = S.nodes.size;
  fill($('node-names'), [...S.nodes.keys()].sort().map((id) => h('option', { value: id })));
  fill($('dc-names'), [...S.dcs.keys()].sort().map((d) => h('option', { value: d })));
}
placePickers.nodes = -1;

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
  jobPage.status = jobState.status;
  jobPage.links = jobState.links;
  jobPage.draw();
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
// the stream would fetch again: so the page asks again while the two disagree, every
// second while a rollout goes on (its healthy count is not on the map), and every few
// seconds anyway (memory and restarts change without a word on the stream).
function jobBehind() {
  const j = S.jobs.get(route.arg);
  const st = jobState.status;
  if (!j || !st || jobState.loading) return false;
  if (st.error || !st.summary) return true;
  if (st.summary.running !== j.running || st.summary.workers !== j.workers || st.summary.generation !== j.generation) return true;
  const ro = st.job && st.job.rollout;
  if ((j.rollout || '') !== (ro && ro.state !== 'done' && ro.state !== 'reverted' ? ro.state : '')) return true;
  if (j.rollout && Date.now() - jobState.loaded >= 1000) return true;
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
  if (route.view !== 'job' || !j || !j.links || jobPage.tab !== 'overview') return;
  try {
    jobState.links = await api.call('GET', '/v1/jobs/' + encodeURIComponent(name) + '/links');
  } catch (e) {
    jobState.links = { failed: e.message };
  }
  if (route.view === 'job' && route.arg === name) renderJob();
}

// ---- routing ----

function go() {
  // #/view, #/view/arg, #/job/NAME/tab, each with ?parameters.
  const m = /^#\/([a-z]+)(?:\/([^/?]*))?(?:\/([a-z]+))?(?:\?(.*))?$/.exec(location.hash);
  const was = route;
  route = { view: m ? m[1] : 'map', arg: m && m[2] ? decodeURIComponent(m[2]) : '', sub: m && m[3] ? m[3] : '', params: new URLSearchParams(m && m[4] ? m[4] : '') };
  if (!['map', 'jobs', 'job', 'nodes', 'node', 'dcs', 'tenants', 'events'].includes(route.view)) route.view = 'map';
  for (const s of document.querySelectorAll('.view')) s.hidden = s.id !== 'view-' + route.view;
  for (const a of document.querySelectorAll('header nav a')) {
    if (a.dataset.view === route.view || (route.view === 'job' && a.dataset.view === 'jobs') || (route.view === 'node' && a.dataset.view === 'nodes')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  clearInterval(jobState.timer);
  if (was.view === 'job' && route.view !== 'job') jobPage.close();
  if (was.view === 'node' && route.view !== 'node') nodePage.close();
  if (was.view === 'events' && route.view !== 'events' && eventsPage) eventsPage.stop();
  if (!api) return;
  if (route.view === 'job') {
    if (jobState.name !== route.arg) jobState = { name: route.arg, status: null, links: null, timer: 0, loading: false, again: false, loaded: 0 };
    jobState.timer = setInterval(jobTick, 1000);
    jobPage.open(route.arg, route.sub, route.params);
    pollLinks();
    loadJob();
  } else if (route.view === 'node') {
    nodePage.open(route.arg);
  } else if (route.view === 'events') {
    openEvents();
  }
  if (S.viewer) {
    pending = pending || emptyChanges();
    pending.full = true;
    draw();
  }
}

// openEvents shows the events page with the filters of the address.
function openEvents() {
  if (!eventsPage) {
    eventsPage = new EventsView(api, $('events-view'), {
      withFilters: true,
      // The filters go into the address (without a new history entry), to be shared.
      onFilters: (f) => {
        const q = new URLSearchParams();
        for (const k of FILTERS) if (f[k]) q.set(k, f[k]);
        const hash = '#/events' + (q.toString() ? '?' + q : '');
        if (location.hash !== hash) history.replaceState(null, '', hash);
        route.params = q;
      },
    });
    window.stormdockEvents = eventsPage;
  }
  const f = {};
  for (const k of FILTERS) if (route.params.get(k)) f[k] = route.params.get(k);
  eventsPage.apply(f);
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
  // rollout promotes, pauses or resumes the job's rollout.
  rollout(j, action) {
    const what = {
      promote: ['Promote', `The canaries of ${j.name} run the new generation and are healthy: the rest of its workers are replaced now, by the rollout's rules.`],
      pause: ['Pause', `The rollout of ${j.name} admits no more workers; replacements under way finish.`],
      resume: ['Resume', `The rollout of ${j.name} continues (a failed one is tried again, with fresh deadlines).`],
    }[action];
    confirmAction({
      title: `${what[0]} the rollout of ${j.name}`, text: what[1], ok: what[0],
      run: () => api.call('POST', `/v1/jobs/${enc(j.name)}/${action}`, {}),
      done: (rec) => { loadJob(); return `Rollout of ${j.name}: ${rec.rollout ? rec.rollout.state : 'done'}.`; },
    });
  },
  // restart restarts the job's workers in place, by failure domain, a few at a time.
  restart(j) {
    confirmAction({
      title: `Restart ${j.name}`,
      text: `Its workers are restarted in place (stopped with their grace period, then started), with the spec's update rules: no spec change, the generation stays.`,
      fields: [
        { name: 'by', label: 'One failure domain at a time', type: 'select', value: '', options: [['', 'the spec\'s (or by worker)'], ['worker', 'by worker'], ['node', 'by node'], ['rack', 'by rack'], ['dc', 'by data center']] },
        { name: 'maxParallel', label: 'At most this many down at once (empty: the spec\'s)', type: 'number', min: 1, value: '' },
        { name: 'workers', label: 'Only these workers (like 0, 3; empty: all)', type: 'text', value: '' },
      ],
      ok: 'Restart', danger: true,
      run: (v) => {
        const body = {};
        if (v.by) body.by = v.by;
        if (v.maxParallel) {
          const n = Number(v.maxParallel);
          if (!Number.isInteger(n) || n < 1) throw new Error('max parallel must be a whole number of at least 1');
          body.maxParallel = n;
        }
        if (v.workers.trim()) {
          body.workers = v.workers.split(/[\s,]+/).filter(Boolean).map((x) => {
            const n = Number(x);
            if (!Number.isInteger(n) || n < 0) throw new Error(`"${x}" is not a worker's index`);
            return n;
          });
        }
        return api.call('POST', `/v1/jobs/${enc(j.name)}/restart`, body);
      },
      done: (rec) => { loadJob(); return `Job ${j.name}: rollout ${rec.rollout.id} restarts ${rec.rollout.total} workers.`; },
    });
  },
  // rollbackTo rolls the job back to a generation (0: the one before the current), chosen
  // in the dialog from its history.
  async rollbackTo(j, gen) {
    let hist;
    try {
      hist = await api.call('GET', `/v1/jobs/${enc(j.name)}/history`);
    } catch (e) {
      toast(e.message, true);
      return;
    }
    const older = hist.generations.filter((g) => g.generation !== hist.current).reverse();
    if (!older.length) {
      toast(`Job ${j.name} has no generation to roll back to.`, true);
      return;
    }
    confirmAction({
      title: `Roll back ${j.name}`,
      text: `A new generation is made from the chosen one's spec and image (keeping the current worker count and update rules), and rolled out without canaries. It is on generation ${hist.current} now.`,
      fields: [{ name: 'to', label: 'To generation', type: 'select', value: String(gen || older[0].generation),
        options: older.map((g) => [String(g.generation), `${g.generation}: ${g.kind} ${new Date(g.at).toLocaleString()}${g.who ? ' by ' + g.who : ''}`]) }],
      ok: 'Roll back', danger: true,
      run: (v) => api.call('POST', `/v1/jobs/${enc(j.name)}/rollback`, { to: Number(v.to) }),
      done: (res, v) => { loadJob(); if (jobPage.tab === 'history') jobPage.loadHistory(); return res.changed ? `Job ${j.name} rolled back to generation ${v.to}'s spec, as generation ${res.job.generation}.` : `Job ${j.name} already runs that spec.`; },
    });
  },
  // endAvoid ends a node's avoidance of a job (an undrain naming the job).
  endAvoid(job, node) {
    confirmAction({
      title: `End ${node}'s avoidance of ${job}`,
      text: `Node ${node} takes ${job}'s workers again at once, and forgets their crash loops there. Its draining, and its avoidance of other jobs, stay as they are.`,
      ok: 'End it',
      run: () => api.call('POST', `/v1/nodes/${enc(node)}/undrain`, { job }),
      done: () => { loadJob(); if (nodePage.id) nodePage.loadAvoided(); return `Node ${node} takes ${job}'s workers again.`; },
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
  // The pages' views hold the API they were made with: a new token makes them anew.
  jobPage.close();
  nodePage.close();
  if (eventsPage) eventsPage.stop();
  eventsPage = null;
  api = new API(token);
  go();
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
  const ctx = {
    get api() { return api; }, S, act: actions, toast, confirm: confirmAction,
    reload: () => loadJob(),
  };
  jobPage = new JobPage($('view-job'), ctx);
  nodePage = new NodePage($('view-node'), ctx);
  window.stormdockPages = { job: jobPage, node: nodePage };
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
