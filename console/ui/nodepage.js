// A node's page: what it is and runs (from the map's stream), the jobs it avoids after
// their workers crash-looped there (since and until when, how to end it), and its recent
// events, live.

import { h, fill, badge, healthBadge, bytes, fmtBytes, ago } from './dom.js';
import { EventsView } from './events.js';
import { workersByJob } from './views.js';

export class NodePage {
  // root is the page's section; ctx holds api, S and act (as for JobPage).
  constructor(root, ctx) {
    this.root = root;
    this.ctx = ctx;
    this.id = '';
    this.avoided = null;
    this.loadedAt = 0;
  }

  open(id) {
    if (id !== this.id) {
      this.close();
      this.id = id;
      this.avoided = null;
      this.sig = '';
      this.info = h('div');
      this.av = h('section', { 'aria-label': 'Jobs the node avoids' });
      const evs = h('section', { class: 'node-events', 'aria-label': 'Recent events of the node' });
      fill(this.root, this.info, this.av, h('h3', null, 'Recent events'), evs);
      this.events = new EventsView(this.ctx.api, evs, { fixed: { node: id }, limit: 200, height: '40vh' });
    }
    this.events.start();
    this.loadAvoided();
    this.draw();
  }

  close() {
    if (this.events) this.events.stop();
    this.id = '';
  }

  // loadAvoided reads the node's avoidances (GET /v1/nodes: they are not on the map).
  async loadAvoided() {
    const id = this.id;
    this.loadedAt = Date.now();
    try {
      const ns = await this.ctx.api.call('GET', '/v1/nodes');
      const n = ns.find((x) => x.id === id);
      if (this.id === id) this.avoided = (n && n.avoided) || [];
    } catch (e) {
      if (this.id === id) this.avoided = { error: e.message };
    }
    if (this.id === id) this.drawAvoided();
  }

  // draw draws what the map knows of the node again (on every change of it).
  draw() {
    if (!this.id) return;
    const { S, act } = this.ctx;
    const n = S.nodes.get(this.id);
    if (Date.now() - this.loadedAt > 10000) this.loadAvoided();
    if (!n) {
      fill(this.info, h('h2', null, 'Node ', this.id), h('p', { class: 'muted' }, 'The node is not registered now (lost, or never was). Its events stay below while the masters keep them.'));
      return;
    }
    const sig = JSON.stringify([n, act.admin]);
    if (sig === this.sig) return;
    this.sig = sig;
    const byJob = workersByJob(n);
    const withheld = Math.min(n.throttled || 0, Math.max(n.slots - n.cells.length, 0));
    fill(this.info,
      h('h2', null, 'Node ', n.id, ' ', n.state === 'lost' ? healthBadge('lost') : healthBadge(n.health), n.draining ? [' ', badge('draining', 'warn')] : null),
      h('div', { class: 'actions' },
        h('button', { type: 'button', onclick: () => act.showNode(n.id) }, 'Show on map'),
        act.admin && n.state !== 'lost' ? (n.draining
          ? h('button', { type: 'button', onclick: () => act.drain(n, false) }, 'Undrain…')
          : h('button', { type: 'button', class: 'danger', onclick: () => act.drain(n, true) }, 'Drain…')) : null),
      h('div', { class: 'summary' },
        h('div', null, h('b', null, 'Place'), `${n.dc} / rack ${n.rack}`),
        h('div', null, h('b', null, 'Slots'), `${n.cells.length} used, ${withheld} withheld, ${n.slots} in all`),
        h('div', null, h('b', null, 'Memory'), `${fmtBytes(bytes(n.memoryUsed))} in use, ${fmtBytes(bytes(n.memoryRequested))} requested, of ${fmtBytes(bytes(n.memory))}`),
        n.reason ? h('div', null, h('b', null, 'Reason'), n.reason) : null,
        n.isolation ? h('div', null, h('b', null, 'Isolation'), n.isolation.join(', ')) : null),
      h('h3', null, 'Workers'),
      byJob.size ? h('ul', null, [...byJob].map(([job, ws]) => h('li', null,
        job === '' ? `other tenants: ${ws.length}` : [h('a', { href: '#/job/' + encodeURIComponent(job) }, job), ': ', ws.join(', ')]))) : h('p', { class: 'muted' }, 'none'));
  }

  drawAvoided() {
    const { S, act } = this.ctx;
    const av = this.avoided;
    if (!av) return;
    if (av.error) {
      fill(this.av, h('h3', null, 'Jobs it avoids'), h('p', { class: 'error' }, av.error));
      return;
    }
    // A tenant sees its own jobs' avoidances only.
    const mine = av.filter((a) => act.admin || S.jobs.has(a.job));
    fill(this.av, h('h3', null, 'Jobs it avoids'), mine.length
      ? h('table', { class: 'avoided' },
        h('thead', null, h('tr', null, ['Job', 'Since', 'Until', 'Crash loops here', 'How to end it'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, mine.map((a) => h('tr', { dataset: { job: a.job } },
          h('td', null, h('a', { href: `#/job/${encodeURIComponent(a.job)}/why` }, a.job)),
          h('td', null, a.since ? ago(a.since) : h('span', { class: 'muted' }, 'not recorded')),
          h('td', null, new Date(a.until).toLocaleString()),
          h('td', { class: 'num' }, String(a.strikes)),
          h('td', null, 'ends by itself then; ', act.admin
            ? h('button', { type: 'button', class: 'quiet', onclick: () => act.endAvoid(a.job, this.id) }, 'End it now…')
            : ['an admin can end it now: ', h('code', null, `stormdock node undrain ${this.id} --job ${a.job}`)])))))
      : h('p', { class: 'muted' }, 'None: no job crash-looped here lately.'));
  }
}
