// The tables: jobs, one job, nodes, data centers, tenants, and the node panel of the map.
// Each takes the console's state S and the actions it may offer (act); actions the viewer
// may not take are not offered (and the API refuses them anyway).

import { h, fill, table, badge, healthBadge, bytes, fmtBytes, ago, dur, bar, colour, jobOf, plural } from './dom.js';

function jobLink(name) {
  return h('a', { href: '#/job/' + encodeURIComponent(name) }, name);
}

function swatch(job) {
  const s = h('span', { class: 'swatch', 'aria-hidden': 'true' });
  s.style.background = colour(job);
  return s;
}

function stateBadge(state) {
  const kind = { running: 'ok', killed: 'bad', starting: 'info', pending: 'info', backoff: 'bad', failed: 'bad', evicted: 'bad', unplaced: 'warn', stopping: '' }[state];
  return badge(state, kind);
}

function reasons(list) {
  if (!list || !list.length) return null;
  return h('ul', { class: 'reasons' }, list.map((r) => h('li', null, `${r.workers} × ${r.reason}`)));
}

// jobs is the job list.
export function jobs(el, S, act) {
  const list = [...S.jobs.values()].sort((a, b) => a.name.localeCompare(b.name));
  if (!list.length) {
    fill(el, h('p', { class: 'muted' }, 'No jobs. Submit one with `stormdock job submit FILE`.'));
    return;
  }
  const rows = list.map((j) => ({
    attrs: { dataset: { job: j.name } },
    cells: [
      h('td', null, swatch(j.name), ' ', jobLink(j.name), j.links ? h('span', { class: 'muted' }, ' mirrored: ' + j.links.join(', ')) : null),
      j.tenant,
      h('td', null, stateBadge(j.state), j.rollout ? [' ', badge('rollout ' + j.rollout, 'info')] : null),
      h('td', { class: 'num', dataset: { running: j.running } }, `${j.running} / ${j.workers}`),
      h('td', { class: 'num' }, String(j.unplaced || 0), reasons(j.reasons)),
      String(j.stopping || 0),
      String(j.generation),
      String(j.priority || 0),
      h('td', null, jobActions(j, act)),
    ],
  }));
  fill(el, table(['Job', 'Tenant', 'State', '#Running / desired', '#Unplaced', '#Stopping', '#Generation', '#Priority', 'Actions'], rows));
}

function jobActions(j, act) {
  if (j.state !== 'running') return null;
  return h('div', { class: 'actions' },
    h('button', { type: 'button', class: 'quiet', onclick: () => act.scale(j) }, 'Scale…'),
    h('button', { type: 'button', class: 'quiet', onclick: () => act.kill(j) }, 'Kill…'));
}

// job is the overview of one job's page (its head, with the actions, is jobpage.js's):
// summary, every worker, and a mirrored job's links. status is GET /v1/jobs/{name}, links
// GET /v1/jobs/{name}/links (or an error).
export function job(el, S, name, status, links, act) {
  const j = S.jobs.get(name);
  if (!j) {
    fill(el);
    return;
  }
  const spec = status && status.job && status.job.spec;
  const parts = [
    h('div', { class: 'summary' },
      h('div', null, h('b', null, 'Tenant'), j.tenant),
      h('div', { dataset: { running: j.running } }, h('b', null, 'Running / desired'), `${j.running} / ${j.workers}`),
      h('div', null, h('b', null, 'Unplaced'), String(j.unplaced || 0)),
      h('div', null, h('b', null, 'Stopping'), String(j.stopping || 0)),
      h('div', null, h('b', null, 'Generation'), String(j.generation)),
      h('div', null, h('b', null, 'Priority'), String(j.priority || 0)),
      spec ? h('div', null, h('b', null, 'Per worker'), `${fmtBytes(bytes(spec.resources.memory))}, ${spec.resources.cpu} cpu, ${spec.isolation || 'process'}`) : null,
      spec && spec.placement && spec.placement.spread ? h('div', null, h('b', null, 'Spread'), spec.placement.spread.join(', ')) : null),
    j.reasons && j.reasons.length ? [reasons(j.reasons), h('p', null, h('a', { href: `#/job/${encodeURIComponent(name)}/why` }, 'Why: the placement engine\'s explanation, check by check'))] : null,
  ];
  if (j.links) parts.push(linksSection(S, j, links, act));
  // The charts keep their own element across redraws (charts.js): this is where it goes.
  parts.push(h('div', { class: 'charts-slot' }));
  parts.push(h('h3', null, 'Workers'));
  if (!status) {
    parts.push(h('p', { class: 'muted' }, 'Loading…'));
  } else if (status.error) {
    parts.push(h('p', { class: 'error' }, status.error));
  } else {
    const rows = status.workers.map((w) => ({
      attrs: { dataset: { worker: (w.link ? w.link + '/' : '') + w.worker, node: w.node || '' } },
      cells: [
        String(w.worker), w.link || '', w.node ? h('a', { href: '#/map', onclick: (e) => { e.preventDefault(); act.showNode(w.node); } }, w.node) : '-',
        w.dc || '', w.rack || '', h('td', null, stateBadge(w.state), w.reason ? h('div', { class: 'muted' }, w.reason) : null),
        String(w.restarts), w.lastExit || '', w.pid ? String(w.pid) : '', w.memory ? fmtBytes(bytes(w.memory)) : '',
        w.generation ? String(w.generation) : '',
        h('td', null, h('a', { href: `#/job/${encodeURIComponent(name)}/logs?source=${encodeURIComponent((w.link ? w.link + '/' : '') + w.worker)}` }, 'Log')),
      ],
    }));
    parts.push(table(['#Worker', 'Link', 'Node', 'DC', 'Rack', 'State', '#Restarts', 'Last exit', '#PID', '#Memory', '#Gen', ''], rows));
  }
  fill(el, parts);
}

function linksSection(S, j, links, act) {
  const out = [h('h3', null, 'Links and output router')];
  // The router is a job of its own on the map.
  const router = j.router;
  let where = null;
  if (router) {
    for (const n of S.nodes.values()) {
      for (const c of n.cells) if (c[0] === router) where = { node: n.id, dc: n.dc, state: c[3] };
    }
  }
  out.push(h('p', null, 'Router ', h('code', null, router || '-'), ': ',
    where ? [h('a', { href: '#/map', onclick: (e) => { e.preventDefault(); act.showNode(where.node); } }, where.node), ` (${where.dc}) `, stateBadge(where.state)] : 'not placed',
    links && links.router ? [' · listening at ', h('code', null, links.router)] : null));
  if (!links) {
    out.push(h('p', { class: 'muted' }, 'Asking the router…'));
    return out;
  }
  if (links.failed) {
    out.push(h('p', { class: 'error' }, links.failed));
    return out;
  }
  if (links.source === 'store') out.push(h('p', { class: 'banner' }, `The router does not answer (${links.error}); this is its last status in the store, as of ${ago(links.updated)}.`));
  out.push(h('div', { class: 'summary' },
    h('div', { dataset: { active: links.active || '' } }, h('b', null, 'Active link'), links.active || 'none yet'),
    h('div', null, h('b', null, 'Last delivered offset'), String(links.delivered)),
    h('div', null, h('b', null, 'Checkpoint'), String(links.checkpoint)),
    h('div', null, h('b', null, 'Failovers'), String(links.failovers)),
    links.lastFailover ? h('div', null, h('b', null, 'Last failover'), `${links.lastFailover.from || '-'} → ${links.lastFailover.to} (${links.lastFailover.reason}) ${ago(links.lastFailover.at)}`) : null));
  const rows = links.links.map((l) => ({
    attrs: { dataset: { link: l.link } },
    cells: [l.link, l.active ? badge('active', 'ok') : '', l.alive ? badge('alive', 'ok') : badge('down', 'bad'), `${l.workersAlive} / ${l.workers}`,
      String(l.lastProduced), String(l.lastDelivered), String(l.lag), l.heartbeatAgeMs < 0 ? 'never' : dur(l.heartbeatAgeMs)],
  }));
  out.push(table(['Link', 'Active', 'Alive', '#Workers alive', '#Last produced', '#Last delivered', '#Lag', '#Heartbeat age'], rows));
  if (j.state === 'running') out.push(h('div', { class: 'actions' }, h('button', { type: 'button', onclick: () => act.failover(j, links) }, 'Fail over…')));
  return out;
}

// nodes is the node table, filtered by a text. Given the ids that changed (changed), it
// redraws only their rows when the table holds the same nodes as before.
export function nodes(el, S, filter, act, changed) {
  const f = filter.trim().toLowerCase();
  const list = [...S.nodes.values()].filter((n) => !f || [n.id, n.dc, n.rack, n.health, n.reason || '', ...Object.entries(n.labels || {}).map(([k, v]) => k + '=' + v)]
    .some((x) => x.toLowerCase().includes(f))).sort((a, b) => a.id.localeCompare(b.id));
  const ids = list.map((n) => n.id).join('\n');
  const rows = el._rows;
  if (changed && rows && el._ids === ids && el._admin === act.admin) {
    for (const id of changed) {
      const n = S.nodes.get(id);
      const old = rows.get(id);
      if (!n || !old) continue;
      const tr = nodeRow(n, act);
      old.replaceWith(tr);
      rows.set(id, tr);
    }
    return;
  }
  const headers = ['Node', 'DC', 'Rack', '#Slots', '#Used', '#Free', '#Withheld', '#Memory used / total', 'Health', 'Labels', 'Isolation', act.admin ? 'Actions' : ''];
  const t = table(headers, [], `${list.length} of ${S.nodes.size} nodes`);
  const body = t.querySelector('tbody');
  el._rows = new Map();
  for (const n of list) {
    const tr = nodeRow(n, act);
    el._rows.set(n.id, tr);
    body.append(tr);
  }
  el._ids = ids;
  el._admin = act.admin;
  fill(el, t);
}

function nodeRow(n, act) {
  const used = n.cells.length;
  const withheld = Math.min(n.throttled || 0, Math.max(n.slots - used, 0));
  const free = n.draining || n.state === 'lost' ? 0 : Math.max(n.slots - used - (n.throttled || 0), 0);
  const labels = Object.entries(n.labels || {}).filter(([k]) => !k.startsWith('isolation/')).map(([k, v]) => k + '=' + v).join(', ');
  const num = (v) => h('td', { class: 'num' }, String(v));
  return h('tr', { dataset: { node: n.id } },
    h('td', null, h('a', { href: '#/node/' + encodeURIComponent(n.id) }, n.id)), h('td', null, n.dc), h('td', null, n.rack),
    num(n.slots), num(used), num(free), num(withheld),
    h('td', { class: 'num' }, `${fmtBytes(bytes(n.memoryUsed))} / ${fmtBytes(bytes(n.memory))}`),
    h('td', null, n.state === 'lost' ? healthBadge('lost') : healthBadge(n.health), n.draining ? [' ', badge('draining', 'warn')] : null, n.reason ? h('div', { class: 'muted' }, n.reason) : null),
    h('td', null, labels), h('td', null, (n.isolation || []).join(', ')),
    h('td', null, act.admin && n.state !== 'lost' ? (n.draining
      ? h('button', { type: 'button', class: 'quiet', onclick: () => act.drain(n, false) }, 'Undrain…')
      : h('button', { type: 'button', class: 'quiet', onclick: () => act.drain(n, true) }, 'Drain…')) : null));
}

// dcs is the data-center table with the placement engine's failover check.
export function dcs(el, S, act) {
  const list = [...S.dcs.values()].sort((a, b) => a.name.localeCompare(b.name));
  const rows = list.map((d) => ({
    attrs: { dataset: { dc: d.name } },
    cells: [d.name, h('td', null, badge(d.state, d.state === 'active' ? 'ok' : 'bad')), ago(d.since), String(d.nodes), String(d.slots), String(d.slotsFree), String(d.workers),
      h('td', null, ifFailed(d)),
      h('td', null, act.admin ? (d.state === 'failed'
        ? h('button', { type: 'button', class: 'quiet', onclick: () => act.dc(d, false) }, 'Restore…')
        : h('button', { type: 'button', class: 'quiet', onclick: () => act.dc(d, true) }, 'Fail…')) : null)],
  }));
  fill(el, table(['Data center', 'State', 'Since', '#Nodes', '#Slots', '#Free', '#Workers', 'If it failed', act.admin ? 'Actions' : ''], rows));
}

function ifFailed(d) {
  const f = d.ifFailed;
  if (!f) return h('span', { class: 'muted' }, d.state === 'active' ? '-' : 'its workers have moved or wait');
  const main = f.fits
    ? badge(`the others take all ${plural(f.moving, 'worker')}`, 'ok')
    : badge(`${plural(f.waiting, 'worker')} would wait` + (f.preempted ? `, ${f.preempted} preempted elsewhere` : ''), 'warn');
  const jobs = (f.jobs || []).map((j) => h('li', null, jobLink(j.job), j.waiting ? ` ${j.waiting} waiting` : '', j.preempted ? ` ${j.preempted} preempted` : ''));
  return [main, f.linksStopping ? h('div', { class: 'muted' }, `${plural(f.linksStopping, 'worker')} of mirrored links stop (their other links carry the output)`) : null,
    jobs.length ? h('ul', { class: 'reasons' }, jobs) : null];
}

// tenants is the tenant table with quota use.
export function tenants(el, S) {
  const list = [...S.tenants.values()].sort((a, b) => a.name.localeCompare(b.name));
  const rows = list.map((t) => ({
    attrs: { dataset: { tenant: t.name } },
    cells: [t.name, String(t.jobs),
      bar(t.usedWorkers, t.maxWorkers || 0, `${t.usedWorkers}${t.maxWorkers ? ' / ' + t.maxWorkers : ''}`),
      bar(bytes(t.usedMemory), bytes(t.maxMemory), `${fmtBytes(bytes(t.usedMemory))}${bytes(t.maxMemory) ? ' / ' + fmtBytes(bytes(t.maxMemory)) : ''}`)],
  }));
  fill(el, table(['Tenant', '#Jobs', 'Workers (quota)', 'Memory (quota)'], rows));
}

// workersByJob groups a node's cells by job ('' for other tenants'): each a list of
// "link/worker state" (a router's "router state").
export function workersByJob(n) {
  const byJob = new Map();
  for (const [job, link, worker, state] of n.cells) {
    const key = job === '' ? '' : jobOf(job);
    if (!byJob.has(key)) byJob.set(key, []);
    byJob.get(key).push(job === '' ? state : `${job !== key ? 'router' : (link ? link + '/' : '') + worker} ${state}`);
  }
  return byJob;
}

// nodePanel is the map's side panel for one node.
export function nodePanel(el, S, id, act) {
  const n = S.nodes.get(id);
  if (!n) {
    fill(el, h('p', { class: 'muted' }, `Node ${id} is gone.`));
    return;
  }
  const byJob = workersByJob(n);
  const withheld = Math.min(n.throttled || 0, Math.max(n.slots - n.cells.length, 0));
  fill(el,
    h('h3', null, 'Node ', n.id),
    h('p', { class: 'small' }, h('a', { href: '#/node/' + encodeURIComponent(n.id) }, 'Its page: events, jobs it avoids')),
    h('dl', null,
      h('dt', null, 'Place'), h('dd', null, `${n.dc} / rack ${n.rack}`),
      h('dt', null, 'State'), h('dd', null, n.state === 'lost' ? healthBadge('lost') : healthBadge(n.health), n.draining ? [' ', badge('draining', 'warn')] : null),
      n.reason ? [h('dt', null, 'Reason'), h('dd', null, n.reason)] : null,
      h('dt', null, 'Slots'), h('dd', null, `${n.cells.length} used, ${withheld} withheld, ${n.slots} in all`),
      h('dt', null, 'Memory'), h('dd', null, `${fmtBytes(bytes(n.memoryUsed))} in use, ${fmtBytes(bytes(n.memoryRequested))} requested, of ${fmtBytes(bytes(n.memory))}`),
      n.isolation ? [h('dt', null, 'Isolation'), h('dd', null, n.isolation.join(', '))] : null),
    h('h3', null, 'Workers'),
    byJob.size ? h('ul', null, [...byJob].map(([job, ws]) => h('li', null,
      job === '' ? `other tenants: ${ws.length}` : [swatch(job), ' ', jobLink(job), ': ', ws.join(', ')]))) : h('p', { class: 'muted' }, 'none'),
    act.admin && n.state !== 'lost' ? h('div', { class: 'actions' }, n.draining
      ? h('button', { type: 'button', onclick: () => act.drain(n, false) }, 'Undrain…')
      : h('button', { type: 'button', class: 'danger', onclick: () => act.drain(n, true) }, 'Drain…')) : null);
}
