// A job's page: its head (name, state, actions, the current rollout) and tabs: Overview
// (workers, links; views.job), Events, Logs, History, Spec and Why. Each tab keeps its
// element and its state (a log stream, an edited spec) while another is shown; only the
// shown one is drawn again when the job changes, and the streams of hidden tabs stop.
// Another tab is added with addTab (a name, a label, and draw/show/hide functions).

import { h, fill, badge, colour } from './dom.js';
import * as views from './views.js';
import { EventsView } from './events.js';
import { LogView } from './logs.js';
import { rolloutBox, history, SpecEditor } from './rollout.js';
import { why } from './why.js';
import { Charts } from './charts.js';

const enc = encodeURIComponent;

// TABS are the page's tabs in order; each draws into its own element.
const TABS = [
  { name: 'overview', label: 'Overview' },
  { name: 'events', label: 'Events' },
  { name: 'logs', label: 'Logs' },
  { name: 'history', label: 'History' },
  { name: 'spec', label: 'Spec' },
  { name: 'why', label: 'Why' },
];

// addTab adds a tab to every job page: draw(el, page) draws it when shown and when the job
// changes; hide(el, page) is called when it is left.
export function addTab(tab) {
  TABS.push(tab);
}

export class JobPage {
  // root is the page's section; ctx holds api, S (the console's state), act (actions),
  // toast and confirm.
  constructor(root, ctx) {
    this.root = root;
    this.ctx = ctx;
    this.name = '';
    this.tab = 'overview';
    this.params = new URLSearchParams();
    this.status = null; // GET /v1/jobs/{name}
    this.links = null;
    this.hist = null;
    this.parts = null;
  }

  // open shows job name at a tab ("logs"), with the tab's parameters (a log's source).
  open(name, tab, params) {
    if (name !== this.name) {
      this.close();
      this.name = name;
      this.status = null;
      this.links = null;
      this.hist = null;
      this.build();
    }
    const prev = this.tab;
    this.tab = TABS.some((t) => t.name === tab) ? tab : 'overview';
    this.params = params || new URLSearchParams();
    if (prev !== this.tab) this.leave(prev);
    this.enter();
  }

  build() {
    this.headSig = '';
    this.whySig = '';
    this.head = h('div', { class: 'job-head' });
    this.nav = h('nav', { class: 'tabs', 'aria-label': 'Job ' + this.name });
    this.panels = {};
    for (const t of TABS) this.panels[t.name] = h('div', { class: 'tab-panel', id: 'job-' + t.name, hidden: true, dataset: { tab: t.name } });
    fill(this.root, this.head, this.nav, Object.values(this.panels));
    this.views = {};
  }

  // leave stops what a hidden tab streams.
  leave(tab) {
    const p = this.panels && this.panels[tab];
    if (!p) return;
    p.hidden = true;
    if (tab === 'events' && this.views.events) this.views.events.stop();
    if (tab === 'logs' && this.views.logs) this.views.logs.stop();
    if (tab === 'overview' && this.charts) this.charts.stop();
    const t = TABS.find((x) => x.name === tab);
    if (t && t.hide) t.hide(p, this);
  }

  enter() {
    const p = this.panels[this.tab];
    p.hidden = false;
    const { api, S } = this.ctx;
    const j = S.jobs.get(this.name);
    switch (this.tab) {
      case 'events':
        if (!this.views.events) this.views.events = new EventsView(api, p, { fixed: { job: this.name }, limit: 500, height: '60vh' });
        this.views.events.start();
        break;
      case 'logs':
        if (!j) break;
        if (!this.views.logs || this.views.logs.job.workers !== j.workers) {
          if (this.views.logs) this.views.logs.stop();
          let routers = 0;
          if (j.router) for (const n of S.nodes.values()) for (const c of n.cells) if (c[0] === j.router) routers = Math.max(routers, c[2] + 1);
          this.views.logs = new LogView(api, p, j, { toast: this.ctx.toast, routers: Math.max(routers, 1) });
        }
        this.views.logs.select(this.params.get('source') || '0', this.params.get('tail'));
        break;
      case 'history':
        this.loadHistory();
        break;
      case 'spec':
        if (!this.views.spec) {
          this.views.spec = new SpecEditor(api, p, this.name, {
            toast: this.ctx.toast, confirm: this.ctx.confirm,
            onUpdated: () => { this.hist = null; this.ctx.reload(); },
          });
          this.views.spec.load();
        }
        break;
      default:
    }
    this.draw();
  }

  close() {
    if (!this.panels) return;
    for (const t of TABS) this.leave(t.name);
    this.charts = null; // it holds the API it was made with: a new token makes another
    this.name = '';
  }

  async loadHistory() {
    const name = this.name;
    this.histLoading = true;
    try {
      const hist = await this.ctx.api.call('GET', `/v1/jobs/${enc(name)}/history`);
      if (this.name === name) this.hist = hist;
    } catch (e) {
      if (this.name === name) this.hist = { error: e.message };
    }
    this.histLoading = false;
    if (this.tab === 'history' && this.name === name) this.draw();
  }

  // draw draws the head and the shown tab again (the job, its status or links changed).
  draw() {
    if (!this.name) return;
    const { S, act } = this.ctx;
    const j = S.jobs.get(this.name);
    const st = this.status;
    this.drawHead(j, st);
    const p = this.panels[this.tab];
    switch (this.tab) {
      case 'overview':
        views.job(p, S, this.name, st, this.links, act);
        if (j) {
          // The charts keep their element and poll while the overview shows (charts.js).
          this.charts = this.charts || new Charts(this.ctx.api);
          this.charts.attach(p.querySelector('.charts-slot'), this.name);
        }
        break;
      case 'history':
        // A new generation (an update, a rollback) is a new row: read the history again.
        if (this.hist && !this.hist.error && j && this.hist.current !== j.generation && !this.histLoading) this.loadHistory();
        history(p, j, this.hist, act);
        break;
      case 'why': {
        const sig = JSON.stringify([st && st.why, st && st.avoided, st && st.error, act.admin, Math.floor(Date.now() / 30000)]);
        if (sig !== this.whySig) why(p, j || { name: this.name }, st, act);
        this.whySig = sig;
        break;
      }
      case 'logs':
        if (!this.views.logs && j) this.enter();
        break;
      default: {
        const t = TABS.find((x) => x.name === this.tab);
        if (t && t.draw) t.draw(p, this);
      }
    }
  }

  drawHead(j, st) {
    const { act } = this.ctx;
    const sw = h('span', { class: 'swatch', 'aria-hidden': 'true' });
    sw.style.background = colour(this.name);
    if (!j) {
      fill(this.head, h('h2', null, 'Job ' + this.name), h('p', { class: 'muted' }, 'No such job (or not yours to see). ', h('a', { href: '#/jobs' }, 'All jobs')));
      this.nav.hidden = true;
      return;
    }
    this.nav.hidden = false;
    const ro = st && st.job && st.job.rollout;
    // Drawn again only when what it shows changed (and every half minute, for its ages):
    // a button keeps the focus while a rollout's status is polled.
    const sig = JSON.stringify([j, ro, st && st.avoided, this.tab, Math.floor(Date.now() / 30000)]);
    if (sig === this.headSig) return;
    this.headSig = sig;
    const running = j.state === 'running';
    const why = (j.unplaced || 0) > 0 || (st && st.avoided && st.avoided.length);
    fill(this.nav, TABS.map((t) => h('a', {
      href: `#/job/${enc(this.name)}/${t.name}`, 'aria-current': t.name === this.tab ? 'page' : null, dataset: { tab: t.name },
    }, t.label, t.name === 'why' && why ? [' ', badge(String((j.unplaced || 0) + (st && st.avoided ? st.avoided.length : 0)), 'warn')] : null)));
    fill(this.head,
      h('h2', null, sw, ' Job ', this.name, ' ', badge(j.state, j.state === 'running' ? 'ok' : 'bad'),
        j.rollout ? [' ', badge('rollout ' + j.rollout, 'info')] : null),
      h('div', { class: 'actions' },
        h('button', { type: 'button', onclick: () => act.showOnMap(this.name) }, 'Show on map'),
        running ? h('button', { type: 'button', onclick: () => act.scale(j) }, 'Scale…') : null,
        running ? h('button', { type: 'button', class: 'quiet', onclick: () => act.restart(j) }, 'Restart…') : null,
        running ? h('button', { type: 'button', class: 'quiet', onclick: () => act.rollbackTo(j, 0) }, 'Roll back…') : null,
        running ? h('button', { type: 'button', class: 'danger', onclick: () => act.kill(j) }, 'Kill…') : null),
      ro ? rolloutBox(j, ro, act) : null);
  }
}
