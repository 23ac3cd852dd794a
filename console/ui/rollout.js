// Rolling updates on a job's page: the current rollout (batch, healthy of total, canaries,
// why it stopped) with promote, pause, resume, roll back and restart; the history of the
// job's generations with who, when and a field-by-field diff; and the spec editor, whose
// text the master checks with the same decoder as `job update` (a dry run first: nothing is
// stored until the operator applies it).

import { h, fill, badge, ago, dur, plural } from './dom.js';

const enc = encodeURIComponent;

const stateKind = { running: 'info', paused: 'warn', 'awaiting-promotion': 'warn', done: 'ok', failed: 'bad', reverting: 'bad', reverted: 'warn' };

function key(k) {
  return `${k.link ? k.link + ' ' : ''}worker ${k.worker}`;
}

// rolloutBox is the job's current (or last) rollout with the actions that fit its state;
// act holds the actions (app.js), j the job's summary from the map.
export function rolloutBox(j, ro, act) {
  if (!ro) return null;
  const active = ro.state !== 'done' && ro.state !== 'reverted';
  if (!active && ro.finished && Date.now() - new Date(ro.finished).getTime() > 10 * 60 * 1000) return null; // old news
  const title = ro.kind === 'restart' ? `Rollout ${ro.id}: restart of generation ${ro.to}` : `Rollout ${ro.id}: ${ro.kind} ${ro.from} → ${ro.to}`;
  const pct = ro.total ? Math.round((ro.healthy / ro.total) * 100) : 0;
  const barIn = h('span');
  barIn.style.width = pct + '%';
  const p = ro.policy || {};
  const facts = [
    h('div', null, h('b', null, 'State'), badge(ro.state, stateKind[ro.state] || '')),
    h('div', { dataset: { healthy: ro.healthy, total: ro.total } }, h('b', null, 'Healthy / total'),
      h('span', { class: 'bar', role: 'img', 'aria-label': pct + '%' }, barIn), `${ro.healthy} / ${ro.total}`),
    h('div', null, h('b', null, 'Batch'), ro.batch ? `${ro.batch}${ro.domain ? ` (${p.by} ${ro.domain})` : ''}` : '-'),
    h('div', null, h('b', null, 'Policy'), `by ${p.by || 'worker'}, ${p.maxParallel || 1} at a time, healthy after ${p.minHealthy || '-'}` +
      (p.autoRevert ? ', reverts on failure' : '')),
    ro.canaries && ro.canaries.length ? h('div', null, h('b', null, 'Canaries'), ro.canaries.map(key).join(', '), ' ', ro.promoted ? badge('promoted', 'ok') : badge('not promoted', 'warn')) : null,
    ro.inFlight && ro.inFlight.length ? h('div', null, h('b', null, 'Being replaced'), ro.inFlight.map((w) => `${key(w.key)} (${dur(Date.now() - new Date(w.since).getTime())})`).join(', ')) : null,
    h('div', null, h('b', null, 'Started'), `${ago(ro.started)}${ro.who ? ' by ' + ro.who : ''}`),
    ro.finished ? h('div', null, h('b', null, 'Finished'), ago(ro.finished)) : null,
  ];
  const can = (s) => s.includes(ro.state);
  const running = j && j.state === 'running';
  const buttons = [
    ro.policy && ro.policy.canary > 0 && !ro.promoted && can(['running', 'awaiting-promotion', 'paused']) && running
      ? h('button', { type: 'button', onclick: () => act.rollout(j, 'promote') }, 'Promote') : null,
    can(['running', 'awaiting-promotion']) && running ? h('button', { type: 'button', class: 'quiet', onclick: () => act.rollout(j, 'pause') }, 'Pause') : null,
    can(['paused', 'failed']) && running ? h('button', { type: 'button', onclick: () => act.rollout(j, 'resume') }, ro.state === 'failed' ? 'Retry' : 'Resume') : null,
  ];
  return h('section', { class: 'rollout', 'aria-label': 'Rollout', dataset: { rollout: ro.id, state: ro.state } },
    h('h3', null, title, ' ', badge(ro.state, stateKind[ro.state] || '')),
    ro.reason ? h('p', { class: ro.state === 'failed' || ro.state === 'reverted' ? 'error' : 'banner-inline' }, ro.reason) : null,
    ro.state === 'awaiting-promotion' ? h('p', { class: 'banner-inline' }, 'The canaries run the new generation and are healthy: promote to replace the rest, or roll back.') : null,
    h('div', { class: 'summary' }, facts),
    h('div', { class: 'actions' }, buttons));
}

// history draws the job's generations (GET /v1/jobs/{name}/history), newest first, each
// with what changed from the one before; act.rollbackTo rolls back to one.
export function history(el, j, hist, act) {
  if (!hist) {
    fill(el, h('p', { class: 'muted' }, 'Loading…'));
    return;
  }
  if (hist.error) {
    fill(el, h('p', { class: 'error' }, hist.error));
    return;
  }
  const gens = [...hist.generations].reverse();
  const rows = gens.map((g) => {
    const current = g.generation === hist.current;
    return h('tr', { dataset: { generation: g.generation }, class: current ? 'current' : null },
      h('td', { class: 'num' }, String(g.generation), current ? [' ', badge('current', 'ok')] : null),
      h('td', null, h('time', { datetime: g.at, title: new Date(g.at).toLocaleString() }, ago(g.at))),
      h('td', null, g.who || '-'), h('td', null, g.kind),
      h('td', null, g.changes && g.changes.length ? diffList(g.changes) : h('span', { class: 'muted' }, g.kind === 'submit' ? 'first generation' : 'no change of the spec'),
        g.image ? h('div', { class: 'muted' }, 'image ', h('code', null, g.image)) : null),
      h('td', null, !current && j && j.state === 'running'
        ? h('button', { type: 'button', class: 'quiet', onclick: () => act.rollbackTo(j, g.generation) }, 'Roll back to this…') : null));
  });
  fill(el,
    h('p', { class: 'muted' }, `${plural(gens.length, 'generation')} kept (the last 50). Each row shows how its spec differs from the one before it.`),
    h('table', { class: 'history' },
      h('thead', null, h('tr', null, h('th', { scope: 'col', class: 'num' }, 'Generation'), ['When', 'Who', 'Kind', 'Changes', ''].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', null, rows)));
}

// diffList shows spec changes as field: from → to.
export function diffList(changes) {
  return h('ul', { class: 'diff' }, changes.map((c) => h('li', { dataset: { field: c.field } },
    h('code', null, c.field), ': ',
    c.from === undefined || c.from === '' ? h('span', { class: 'muted' }, '(none)') : h('del', null, c.from),
    ' → ',
    c.to === undefined || c.to === '' ? h('span', { class: 'muted' }, '(none)') : h('ins', null, c.to))));
}

// SpecEditor edits a job's spec as YAML (or JSON) and sends it as an update: Check asks the
// master for a dry run (the decoder's problems, with field and line, or the changes it
// would make); Update applies it. Nothing is stored while there are problems.
export class SpecEditor {
  constructor(api, el, job, { toast, onUpdated, confirm } = {}) {
    this.api = api;
    this.el = el;
    this.job = job;
    this.toast = toast || (() => {});
    this.confirm = confirm;
    this.onUpdated = onUpdated || (() => {});
    this.loaded = null; // the spec as loaded
    this.text = h('textarea', { class: 'spec', name: 'spec', spellcheck: 'false', autocomplete: 'off', wrap: 'off', rows: 24, 'aria-label': 'Job spec (YAML or JSON)', 'aria-describedby': 'spec-where' });
    // Line numbers beside the text, for the problems' lines.
    this.gutter = h('div', { class: 'gutter', 'aria-hidden': 'true' });
    const number = () => {
      const n = this.text.value.split('\n').length;
      if (n !== this.gutter.childElementCount) fill(this.gutter, Array.from({ length: n }, (_, i) => h('div', null, String(i + 1))));
      this.gutter.scrollTop = this.text.scrollTop;
    };
    this.number = number;
    this.text.addEventListener('input', number);
    this.text.addEventListener('scroll', () => { this.gutter.scrollTop = this.text.scrollTop; });
    this.where = h('span', { id: 'spec-where', class: 'muted' });
    this.out = h('div', { class: 'spec-result', 'aria-live': 'polite' });
    this.busy = false;
    this.format = h('select', { name: 'format', 'aria-label': 'Load the spec as' }, h('option', { value: 'yaml' }, 'YAML'), h('option', { value: 'json' }, 'JSON'));
    fill(el,
      h('p', { class: 'muted' }, 'Edit the spec and check it: the master reads it with the same decoder as ', h('code', null, 'stormdock job update'),
        ' and answers every problem with its field and line, or what the update would change. Nothing is applied until you press Update; its ',
        h('code', null, 'update:'), ' block says how the rollout goes (maxParallel, canary, by, minHealthy, deadline, autoRevert).'),
      h('div', { class: 'toolbar' },
        h('label', null, 'Load as ', this.format),
        h('button', { type: 'button', class: 'quiet', onclick: () => this.load() }, 'Reload the current spec'),
        h('span', { class: 'spacer' }), this.where),
      h('div', { class: 'editor' }, this.gutter, this.text),
      h('div', { class: 'actions' },
        h('button', { type: 'button', onclick: () => this.check() }, 'Check'),
        h('button', { type: 'button', class: 'danger', onclick: () => this.apply() }, 'Update…')),
      this.out);
    this.format.addEventListener('change', () => this.load());
    const pos = () => {
      const before = this.text.value.slice(0, this.text.selectionStart);
      const line = before.split('\n').length;
      this.where.textContent = `line ${line}, column ${before.length - before.lastIndexOf('\n')}`;
    };
    for (const ev of ['keyup', 'click', 'select', 'focus']) this.text.addEventListener(ev, pos);
    this.text.addEventListener('keydown', (e) => {
      // Tab indents by two spaces in the editor; Escape then Tab leaves it (as in any editor
      // that takes Tab), and Ctrl+Enter checks.
      if (e.key === 'Tab' && !e.shiftKey && !this.escaped) {
        e.preventDefault();
        this.text.setRangeText('  ', this.text.selectionStart, this.text.selectionEnd, 'end');
      } else if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        this.check();
      }
      this.escaped = e.key === 'Escape';
    });
  }

  async load() {
    fill(this.out);
    try {
      if (this.format.value === 'json') {
        const st = await this.api.call('GET', `/v1/jobs/${enc(this.job)}?workers=false`);
        this.text.value = JSON.stringify(st.job.spec, null, 2) + '\n';
        this.loaded = { generation: st.job.generation };
      } else {
        const s = await this.api.call('GET', `/v1/jobs/${enc(this.job)}/spec`);
        this.text.value = s.spec;
        this.loaded = { generation: s.generation };
      }
      this.el.dataset.generation = String(this.loaded.generation);
      this.el.dataset.loaded = 'true';
      this.number();
    } catch (e) {
      fill(this.out, h('p', { class: 'error' }, e.message));
    }
  }

  // check asks for a dry run and shows its answer.
  async check() {
    return this.send(true);
  }

  // apply checks first, then asks the operator to confirm what the update changes.
  async apply() {
    const res = await this.send(true);
    if (!res || !res.changed) return;
    const ro = res.job.rollout;
    this.confirm({
      title: `Update ${this.job}`,
      text: `Generation ${res.job.generation}, changing ${plural(res.changes ? res.changes.length : 0, 'field')} (${(res.changes || []).map((c) => c.field).join(', ')}). ` +
        (ro ? `Its rollout starts at once: by ${ro.policy.by}, ${ro.policy.maxParallel} at a time${ro.policy.canary ? `, ${plural(ro.policy.canary, 'canary')} first` : ''}.` : ''),
      ok: 'Update', danger: true,
      run: async () => {
        const r = await this.send(false);
        if (!r) throw new Error('Not applied: see the problems below the spec.');
        return r;
      },
      done: (r) => `Job ${this.job} updated to generation ${r.job.generation}.`,
    });
  }

  async send(dryRun) {
    if (this.busy) return null;
    this.busy = true;
    this.el.dataset.state = 'checking';
    try {
      const res = await this.api.call('POST', `/v1/jobs/${enc(this.job)}/update`, { spec: this.text.value, dryRun });
      this.el.dataset.state = dryRun ? 'checked' : 'applied';
      if (!res.changed) {
        fill(this.out, h('p', { class: 'ok-text' }, 'The spec is valid and the same as the current one: an update would change nothing.'));
      } else if (dryRun) {
        fill(this.out, h('p', { class: 'ok-text' }, `Valid. Updating makes generation ${res.job.generation}, changing:`), diffList(res.changes || []),
          res.job.rollout ? h('p', { class: 'muted' }, `Its rollout: by ${res.job.rollout.policy.by}, ${res.job.rollout.policy.maxParallel} at a time` +
            (res.job.rollout.policy.canary ? `, ${plural(res.job.rollout.policy.canary, 'canary')} first, then waiting for promotion` : '') + '.') : null);
      } else {
        fill(this.out, h('p', { class: 'ok-text' }, `Updated: generation ${res.job.generation}; its rollout has started.`), diffList(res.changes || []));
        this.onUpdated(res);
      }
      return res;
    } catch (e) {
      this.el.dataset.state = 'refused';
      this.problems(e);
      return null;
    } finally {
      this.busy = false;
    }
  }

  // problems lists an error's problems, each a button that selects its line.
  problems(e) {
    const ps = e.problems || [];
    fill(this.out, h('p', { class: 'error', role: 'alert' }, ps.length ? `Not applied: ${plural(ps.length, 'problem')} in the spec.` : 'Not applied: ' + e.message),
      ps.length ? h('ul', { class: 'problems' }, ps.map((p) => h('li', { dataset: { field: p.field || '', line: p.line || 0 } },
        p.line ? h('button', { type: 'button', class: 'link', onclick: () => this.goTo(p.line) }, `line ${p.line}`) : h('span', { class: 'muted' }, 'no line'),
        ' ', p.field ? [h('code', null, p.field), ': '] : null, p.msg))) : null);
  }

  // goTo selects a line of the text and puts the cursor there.
  goTo(line) {
    const lines = this.text.value.split('\n');
    let start = 0;
    for (let i = 0; i < line - 1 && i < lines.length; i++) start += lines[i].length + 1;
    const end = start + (lines[line - 1] || '').length;
    this.text.focus();
    this.text.setSelectionRange(start, end);
    // Scroll the line into view: lines are of one height in the text area.
    const lh = parseFloat(getComputedStyle(this.text).lineHeight) || 18;
    this.text.scrollTop = Math.max(0, (line - 3) * lh);
    this.gutter.scrollTop = this.text.scrollTop;
    for (const d of this.gutter.children) d.classList.toggle('at', d.textContent === String(line));
  }
}
