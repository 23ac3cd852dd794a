// The cluster map: data centers, their racks, each rack's nodes, each node's slots as cells
// coloured by the job holding them. A delta redraws only the nodes it names.

import { h, fill, bytes, colour, jobOf, fmtBytes, badge, plural } from './dom.js';

// COMPACT is the node count above which the map drops node names and shrinks cells.
const COMPACT = 60;

export class ClusterMap {
  // root is the map's element; onNode(id) opens a node, onJob(job) highlights a job (a
  // click on one of its cells); state is the console's state (dcs, nodes, jobs maps).
  constructor(root, state, onNode, onJob) {
    this.root = root;
    this.S = state;
    this.onNode = onNode;
    this.onJob = onJob;
    this.dcEls = new Map(); // dc -> {el, head, racks: Map(rack -> {el, nodes})}
    this.nodeEls = new Map(); // id -> element
    this.highlight = ''; // job whose workers stand out
    this.filter = { job: '', tenant: '' };
    this.selected = '';
    root.addEventListener('keydown', (e) => this.key(e));
    root.addEventListener('click', (e) => {
      const c = e.target.closest('.cell[data-j]');
      if (c) this.onJob(c.dataset.j);
      const n = e.target.closest('.node');
      if (n) this.open(n);
    });
  }

  // full draws the whole map again.
  full() {
    this.root.replaceChildren();
    this.dcEls.clear();
    this.nodeEls.clear();
    const dcs = [...new Set([...this.S.dcs.keys(), ...[...this.S.nodes.values()].map((n) => n.dc)])].sort();
    for (const dc of dcs) this.dcEl(dc);
    const ids = [...this.S.nodes.keys()].sort();
    for (const id of ids) this.place(this.S.nodes.get(id));
    this.root.classList.toggle('compact', this.S.nodes.size > COMPACT);
    this.roving();
    this.applyMarks();
  }

  // update redraws what a delta changed: nodes (ids changed or gone), data centers, and,
  // when jobs came or went, the tenant of each cell.
  update(ch) {
    for (const dc of ch.dcs) {
      if (this.S.dcs.has(dc)) this.dcEl(dc); else this.dropDC(dc);
    }
    for (const id of ch.nodes) {
      const old = this.nodeEls.get(id);
      const n = this.S.nodes.get(id);
      if (!n) {
        if (old) old.remove();
        this.nodeEls.delete(id);
        continue;
      }
      if (old && old.dataset.place === n.dc + '/' + n.rack) {
        const el = this.nodeEl(n);
        if (old.tabIndex === 0) el.tabIndex = 0;
        const focused = document.activeElement === old;
        old.replaceWith(el);
        this.nodeEls.set(id, el);
        if (focused) el.focus();
      } else {
        if (old) old.remove();
        this.place(n);
      }
    }
    // A data center shows its nodes' counts; refresh the heads of those that changed.
    const heads = new Set(ch.dcs);
    for (const id of ch.nodes) {
      const n = this.S.nodes.get(id);
      if (n) heads.add(n.dc);
    }
    for (const dc of heads) this.dcHead(dc);
    for (const [dc, d] of this.dcEls) {
      for (const [rack, r] of d.racks) {
        if (!r.nodes.firstChild) { r.el.remove(); d.racks.delete(rack); }
      }
      if (!d.racks.size && !this.S.dcs.has(dc)) this.dropDC(dc);
    }
    this.root.classList.toggle('compact', this.S.nodes.size > COMPACT);
    if (ch.jobsAdded) {
      // A job's tenant shows on its cells: mark them again (nodeEl marks the new ones).
      for (const el of this.nodeEls.values()) this.tenantMarks(el);
      this.applyMarks();
    }
    this.roving();
  }

  dropDC(dc) {
    const d = this.dcEls.get(dc);
    if (!d) return;
    d.el.remove();
    this.dcEls.delete(dc);
  }

  // dcEl returns the data center's section, making it (in name order) when missing.
  dcEl(dc) {
    let d = this.dcEls.get(dc);
    if (!d) {
      const head = h('div', { class: 'dc-head' });
      const racks = h('div', { class: 'racks' });
      const el = h('section', { class: 'dc', 'aria-label': 'data center ' + dc, dataset: { dc } }, head, racks);
      d = { el, head, racksEl: racks, racks: new Map() };
      const after = [...this.dcEls.keys()].sort().find((x) => x > dc);
      this.root.insertBefore(el, after ? this.dcEls.get(after).el : null);
      this.dcEls.set(dc, d);
    }
    this.dcHead(dc);
    return d;
  }

  dcHead(dc) {
    const d = this.dcEls.get(dc);
    if (!d) return;
    const rec = this.S.dcs.get(dc);
    const state = rec ? rec.state : 'active';
    d.el.classList.toggle('failed', state === 'failed');
    d.el.classList.toggle('lost', state === 'lost');
    const parts = [h('h3', null, dc), badge(state, state === 'active' ? 'ok' : 'bad')];
    if (rec) {
      parts.push(h('span', { class: 'muted' }, `${plural(rec.nodes, 'node')} · ${plural(rec.workers, 'worker')} · ${rec.slotsFree} of ${plural(rec.slots, 'slot')} free`));
      const f = rec.ifFailed;
      if (f) {
        parts.push(f.fits
          ? badge(`if it failed: the others take its ${plural(f.moving, 'worker')}`, 'ok', 'planned by the placement engine')
          : badge(`if it failed: ${plural(f.waiting, 'worker')} would wait` + (f.preempted ? `, ${f.preempted} preempted` : ''), 'warn', 'planned by the placement engine'));
      }
    }
    fill(d.head, parts);
  }

  // place inserts a node in its rack, in id order.
  place(n) {
    const d = this.dcEl(n.dc);
    let r = d.racks.get(n.rack);
    if (!r) {
      const nodes = h('div', { class: 'nodes' });
      const el = h('div', { class: 'rack', role: 'row', 'aria-label': `rack ${n.rack} of ${n.dc}` }, h('div', { class: 'rack-head' }, 'rack ' + n.rack), nodes);
      r = { el, nodes };
      const after = [...d.racks.keys()].sort().find((x) => x > n.rack);
      d.racksEl.insertBefore(el, after ? d.racks.get(after).el : null);
      d.racks.set(n.rack, r);
    }
    const el = this.nodeEl(n);
    let before = null;
    for (const c of r.nodes.children) {
      if (c.dataset.id > n.id) { before = c; break; }
    }
    r.nodes.insertBefore(el, before);
    this.nodeEls.set(n.id, el);
  }

  // nodeEl draws one node: name, flags, cells and a memory bar.
  nodeEl(n) {
    const cls = ['node'];
    const flags = [];
    if (n.state === 'lost') { cls.push('lost'); flags.push('lost'); }
    if (n.draining) { cls.push('draining'); flags.push('draining'); }
    if (n.health === 'throttled') cls.push('h-throttled');
    if (n.health === 'unhealthy') cls.push('h-unhealthy');
    if (n.health !== 'healthy' && n.state !== 'lost') flags.push(n.health + (n.reason ? ': ' + n.reason : ''));
    if (n.id === this.selected) cls.push('selected');
    const cells = n.cells || [];
    const withheld = Math.min(n.throttled || 0, Math.max(n.slots - cells.length, 0));
    const free = Math.max(n.slots - cells.length - withheld, 0);
    const grid = h('div', { class: 'cells' });
    grid.style.gridTemplateColumns = `repeat(${Math.ceil(Math.sqrt(Math.max(n.slots, cells.length, 1)))}, var(--cell))`;
    for (const [job, link, worker, state] of cells) {
      let c;
      if (job === '') {
        c = h('span', { class: 'cell other s-' + state, title: `another tenant's worker (${state})` });
      } else {
        const owner = jobOf(job);
        c = h('span', {
          class: 'cell s-' + state + (owner !== job ? ' router' : ''),
          title: `${job}${link ? '@' + link : ''}/${worker} ${state}`,
          dataset: { j: owner },
        });
        c.style.background = colour(owner);
      }
      grid.append(c);
    }
    for (let i = 0; i < free; i++) grid.append(h('span', { class: 'cell free', title: 'free slot' }));
    for (let i = 0; i < withheld; i++) grid.append(h('span', { class: 'cell withheld', title: 'slot withheld by health checks: ' + (n.reason || n.health) }));
    const mem = bytes(n.memory);
    const used = bytes(n.memoryUsed);
    const req = bytes(n.memoryRequested);
    const memEl = h('div', { class: 'mem', title: `memory: ${fmtBytes(used)} in use, ${fmtBytes(req)} requested, of ${fmtBytes(mem)}` });
    if (mem > 0) {
      const u = h('span', { class: 'used' + (used / mem > 0.8 ? ' high' : '') });
      u.style.width = Math.min(100, (used / mem) * 100) + '%';
      const r = h('span', { class: 'req' });
      r.style.left = Math.min(99, (req / mem) * 100) + '%';
      memEl.append(u, r);
    }
    const label = `node ${n.id}, ${n.state === 'lost' ? 'lost' : n.health}${n.draining ? ', draining' : ''}: ` +
      `${plural(cells.length, 'worker')}, ${free} free, ${withheld} withheld of ${plural(n.slots, 'slot')}`;
    const el = h('div', {
      class: cls.join(' '), role: 'gridcell', tabindex: '-1', 'aria-label': label,
      dataset: { id: n.id, place: n.dc + '/' + n.rack, workers: cells.length, withheld, free },
    },
    h('div', { class: 'nname' }, n.id),
    flags.length ? h('div', { class: 'nflags' }, flags.join(' · ')) : null,
    grid, memEl);
    this.tenantMarks(el);
    this.marks(el);
    return el;
  }

  // tenantMarks notes each cell's tenant, for the tenant filter.
  tenantMarks(el) {
    for (const c of el.querySelectorAll('.cell[data-j]')) {
      const j = this.S.jobs.get(c.dataset.j);
      if (j) c.dataset.t = j.tenant; else delete c.dataset.t;
    }
  }

  // setHighlight makes one job's workers stand out everywhere ('' for none).
  setHighlight(job) {
    this.highlight = job;
    this.applyMarks();
  }

  setFilter(f) {
    this.filter = f;
    this.applyMarks();
  }

  setSelected(id) {
    if (this.selected) this.nodeEls.get(this.selected)?.classList.remove('selected');
    this.selected = id;
    if (id) this.nodeEls.get(id)?.classList.add('selected');
  }

  applyMarks() {
    this.root.classList.toggle('highlighting', !!this.highlight);
    for (const el of this.nodeEls.values()) this.marks(el);
  }

  matches(c) {
    const f = this.filter;
    if (!f.job && !f.tenant) return true;
    const j = c.dataset.j;
    if (!j) return false;
    if (f.job && !j.includes(f.job)) return false;
    if (f.tenant && c.dataset.t !== f.tenant) return false;
    return true;
  }

  // marks applies highlight and filter to one node's cells.
  marks(el) {
    const filtering = !!(this.filter.job || this.filter.tenant);
    let any = false;
    for (const c of el.querySelectorAll('.cell')) {
      const worker = !c.classList.contains('free') && !c.classList.contains('withheld');
      c.classList.toggle('hl', !!this.highlight && c.dataset.j === this.highlight);
      const m = !worker || this.matches(c);
      c.classList.toggle('dim', filtering && worker && !m);
      if (worker && m) any = true;
    }
    el.classList.toggle('faded', filtering && !any);
  }

  // roving keeps one node in the tab order: the selected one, or the first.
  roving() {
    let cur = null;
    for (const el of this.nodeEls.values()) if (el.tabIndex === 0) { cur = el; break; }
    if (cur && cur.isConnected) return;
    const first = this.root.querySelector('.node');
    if (first) first.tabIndex = 0;
  }

  key(e) {
    const el = e.target.closest('.node');
    if (!el) return;
    const all = [...this.root.querySelectorAll('.node')];
    const i = all.indexOf(el);
    let next = null;
    switch (e.key) {
      case 'ArrowRight': case 'ArrowDown': next = all[i + 1]; break;
      case 'ArrowLeft': case 'ArrowUp': next = all[i - 1]; break;
      case 'Home': next = all[0]; break;
      case 'End': next = all[all.length - 1]; break;
      case 'Enter': case ' ': this.open(el); e.preventDefault(); return;
      default: return;
    }
    e.preventDefault();
    if (!next) return;
    el.tabIndex = -1;
    next.tabIndex = 0;
    next.focus();
  }

  open(el) {
    for (const x of this.nodeEls.values()) if (x.tabIndex === 0 && x !== el) x.tabIndex = -1;
    el.tabIndex = 0;
    this.onNode(el.dataset.id);
  }
}
