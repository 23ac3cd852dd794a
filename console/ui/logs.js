// A worker's log in the browser: GET /v1/jobs/{job}/logs through the master, the tail and
// then, when following, what the worker writes as it writes it; the run before its last
// restart; a mirrored job's link worker or its output routers. The view holds a window of
// the newest lines (MAX_LINES, MAX_CHARS) and draws only those in view, however long the
// log; search looks in what it holds; download fetches the whole log kept on the node
// straight into a file, never into the page.

import { h, fill } from './dom.js';
import { VirtualList } from './vlist.js';

const ROW = 18;
export const MAX_LINES = 10000;
const MAX_CHARS = 4 << 20;
// A line longer than this is cut in the view (the download has it whole).
const MAX_LINE = 4096;

const enc = encodeURIComponent;

// LogView is the log tab of a job's page. job is the job's summary from the map (name,
// workers, links); the worker shown is chosen in its toolbar.
export class LogView {
  // routers is how many output routers a mirrored job has (the map's cells say).
  constructor(api, el, job, { toast, routers = 2 } = {}) {
    this.api = api;
    this.el = el;
    this.job = job;
    this.routers = routers;
    this.toast = toast || (() => {});
    this.lines = [];
    this.chars = 0;
    this.dropped = 0; // lines dropped from the head, for absolute line numbers
    this.partial = '';
    this.ctrl = null;
    this.node = '';
    this.query = '';
    this.matches = [];
    this.match = -1;
    this.searchTimer = 0;
    this.stats = { lines: 0, bytes: 0 };
    this.build();
  }

  // sources lists what the view can show: each worker (of each link), and the routers.
  sources() {
    const j = this.job;
    const out = [];
    const per = j.links ? Math.round(j.workers / j.links.length) : j.workers;
    for (const link of j.links || ['']) {
      for (let w = 0; w < per; w++) out.push({ value: (link ? link + '/' : '') + w, label: link ? `${link} worker ${w}` : `worker ${w}`, link, worker: w });
    }
    if (j.router) for (let r = 0; r < this.routers; r++) out.push({ value: 'router/' + r, label: `output router ${r}`, router: true, worker: r });
    return out;
  }

  build() {
    const srcs = this.sources();
    this.src = h('select', { name: 'source', 'aria-label': 'Whose log' }, srcs.map((s) => h('option', { value: s.value }, s.label)));
    this.tail = h('select', { name: 'tail', 'aria-label': 'Lines from the end' },
      [['0', 'new lines only'], ['100', 'last 100 lines'], ['1000', 'last 1,000'], [String(MAX_LINES), `last ${MAX_LINES.toLocaleString()}`], ['-1', 'all kept']]
        .map(([v, t]) => h('option', { value: v }, t)));
    this.tail.value = '100'; // as `stormdock job logs`
    this.followBtn = h('button', { type: 'button', 'aria-pressed': 'true', title: 'Keep printing what the worker writes' }, 'Follow');
    this.prevBtn = h('button', { type: 'button', class: 'quiet', 'aria-pressed': 'false', title: 'The run before its last restart' }, 'Previous run');
    this.search = h('input', { type: 'search', name: 'search', placeholder: 'Search the lines loaded', spellcheck: 'false', 'aria-label': 'Search the lines loaded' });
    this.found = h('span', { class: 'muted', role: 'status', 'aria-live': 'polite' });
    this.status = h('span', { class: 'muted', role: 'status' });
    this.box = h('div', { class: 'log', tabindex: '0', role: 'log', 'aria-label': 'Log lines, oldest first', 'aria-live': 'off' });
    fill(this.el,
      h('div', { class: 'toolbar' },
        h('label', null, 'Log of ', this.src), this.tail, this.followBtn, this.prevBtn,
        h('button', { type: 'button', class: 'quiet', onclick: () => this.download() }, 'Download'),
        h('button', { type: 'button', class: 'quiet', onclick: () => this.clear() }, 'Clear')),
      h('div', { class: 'toolbar' },
        this.search,
        h('button', { type: 'button', class: 'quiet', onclick: () => this.next(-1), 'aria-label': 'Previous match' }, '↑'),
        h('button', { type: 'button', class: 'quiet', onclick: () => this.next(1), 'aria-label': 'Next match' }, '↓'),
        this.found, h('span', { class: 'spacer' }), this.status),
      this.box);
    this.list = new VirtualList(this.box, { rowHeight: ROW, count: () => this.lines.length, row: (i) => this.row(i) });
    this.src.addEventListener('change', () => this.start());
    this.tail.addEventListener('change', () => this.start());
    this.followBtn.addEventListener('click', () => {
      const on = this.followBtn.getAttribute('aria-pressed') !== 'true';
      this.followBtn.setAttribute('aria-pressed', String(on));
      if (on) this.prevBtn.setAttribute('aria-pressed', 'false');
      this.start();
    });
    this.prevBtn.addEventListener('click', () => {
      const on = this.prevBtn.getAttribute('aria-pressed') !== 'true';
      this.prevBtn.setAttribute('aria-pressed', String(on));
      if (on) this.followBtn.setAttribute('aria-pressed', 'false');
      this.start();
    });
    this.search.addEventListener('input', () => {
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => this.find(this.search.value), 150);
    });
    this.search.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); this.next(e.shiftKey ? -1 : 1); }
    });
  }

  // select shows a source ("2", "dc-a/1", "router/0") from tail lines before its end
  // (the toolbar's choice when not given) and starts reading it.
  select(value, tail) {
    if ([...this.src.options].some((o) => o.value === value)) this.src.value = value;
    if (tail && [...this.tail.options].some((o) => o.value === tail)) this.tail.value = tail;
    this.start();
  }

  get following() { return this.followBtn.getAttribute('aria-pressed') === 'true'; }
  get previous() { return this.prevBtn.getAttribute('aria-pressed') === 'true'; }

  request(tail, follow) {
    const s = this.sources().find((x) => x.value === this.src.value) || this.sources()[0];
    const q = new URLSearchParams({ worker: String(s.worker), tail: String(tail) });
    if (s.link) q.set('link', s.link);
    if (s.router) q.set('router', 'true');
    if (follow) q.set('follow', 'true');
    if (this.previous) q.set('previous', 'true');
    return { path: `/v1/jobs/${enc(this.job.name)}/logs?${q}`, source: s };
  }

  // start reads the chosen log from the start again.
  start() {
    this.stop();
    this.clear();
    this.run(Number(this.tail.value), this.following);
  }

  // run reads one answer; a followed one that ends (the worker moved, the master
  // changed) is asked again for what comes after, a second later.
  async run(tail, follow) {
    const ctrl = new AbortController();
    this.ctrl = ctrl;
    const { path, source } = this.request(tail, follow);
    this.setStatus(`reading ${source.label}…`);
    try {
      const res = await this.api.fetchRaw(path, ctrl.signal);
      this.node = res.headers.get('X-Stormdock-Node') || '';
      this.el.dataset.node = this.node;
      this.setStatus();
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        this.stats.bytes += value.length;
        this.take(value);
      }
      if (this.partial) this.take('\n');
      if (!follow) {
        this.setStatus(this.lines.length ? 'end of the log' : 'the log is empty');
        return;
      }
      this.setStatus('the stream ended; asking again…');
    } catch (e) {
      if (ctrl.signal.aborted) return;
      this.setStatus(e.message, true);
      if (!follow || (e.status >= 400 && e.status < 500 && e.status !== 404)) return;
    }
    if (ctrl.signal.aborted) return;
    await new Promise((r) => setTimeout(r, 1000));
    if (this.ctrl === ctrl && !ctrl.signal.aborted) {
      this.separator('(reconnected: lines written meanwhile on a lost node may be missing)');
      this.run(0, true);
    }
  }

  stop() {
    if (this.ctrl) this.ctrl.abort();
    this.ctrl = null;
  }

  clear() {
    this.lines = [];
    this.chars = 0;
    this.dropped = 0;
    this.partial = '';
    this.matches = [];
    this.match = -1;
    this.found.textContent = '';
    this.list.stick = true;
    this.list.refresh();
    this.el.dataset.lines = '0';
  }

  // take adds a chunk of the log: whole lines at once, a partial one when it ends.
  take(chunk) {
    const parts = (this.partial + chunk).split('\n');
    this.partial = parts.pop();
    if (this.partial.length > MAX_LINE * 4) { // a line without end: show what came
      parts.push(this.partial);
      this.partial = '';
    }
    if (!parts.length) return;
    this.append(parts);
  }

  separator(text) {
    this.append(['\u0000' + text]);
  }

  append(lines) {
    const at = performance.timeOrigin + performance.now();
    for (let l of lines) {
      if (l.endsWith('\r')) l = l.slice(0, -1);
      if (l.length > MAX_LINE) l = l.slice(0, MAX_LINE) + `… (${(l.length - MAX_LINE).toLocaleString()} more characters: download the log for them)`;
      this.lines.push(l);
      this.chars += l.length;
    }
    this.stats.lines += lines.length;
    // Drop the oldest beyond the window, a batch at a time.
    let cut = 0;
    let chars = this.chars;
    while (this.lines.length - cut > MAX_LINES || (chars > MAX_CHARS && this.lines.length - cut > 1)) {
      chars -= this.lines[cut].length;
      cut++;
    }
    if (cut) {
      this.lines.splice(0, cut);
      this.chars = chars;
      this.dropped += cut;
      // A reader scrolled up keeps the lines they read in view.
      if (!this.list.stick) this.box.scrollTop = Math.max(0, this.box.scrollTop - cut * ROW);
    }
    if (this.query) {
      const from = this.lines.length - lines.length;
      this.matches = this.matches.filter((m) => m >= this.dropped);
      const q = this.query;
      for (let i = Math.max(from, 0); i < this.lines.length; i++) if (this.lines[i].toLowerCase().includes(q)) this.matches.push(this.dropped + i);
      this.foundText();
    }
    this.list.refresh();
    this.el.dataset.lines = String(this.lines.length);
    this.el.dataset.dropped = String(this.dropped);
    if (window.stormdockLogProbe) window.stormdockLogProbe(lines, at);
    this.setStatus();
  }

  row(i) {
    const text = this.lines[i];
    const abs = this.dropped + i;
    if (text.startsWith('\u0000')) return h('div', { class: 'line sep' }, text.slice(1));
    const el = h('div', { class: 'line' + (this.matches[this.match] === abs ? ' current' : '') });
    const q = this.query;
    if (!q || !text.toLowerCase().includes(q)) {
      el.textContent = text || ' ';
      return el;
    }
    const lower = text.toLowerCase();
    let at = 0;
    for (let k = lower.indexOf(q); k >= 0; k = lower.indexOf(q, at)) {
      if (k > at) el.append(text.slice(at, k));
      el.append(h('mark', null, text.slice(k, k + q.length)));
      at = k + q.length;
    }
    if (at < text.length) el.append(text.slice(at));
    return el;
  }

  find(query) {
    this.query = query.toLowerCase();
    this.matches = [];
    this.match = -1;
    if (this.query) {
      for (let i = 0; i < this.lines.length; i++) if (this.lines[i].toLowerCase().includes(this.query)) this.matches.push(this.dropped + i);
    }
    this.foundText();
    if (this.matches.length) this.next(1); else this.list.draw(true);
  }

  // next moves to the next (dir 1) or previous (-1) match and shows it.
  next(dir) {
    if (!this.matches.length) return;
    this.match = (this.match + dir + this.matches.length) % this.matches.length;
    this.foundText();
    this.list.show(this.matches[this.match] - this.dropped);
  }

  foundText() {
    this.found.textContent = this.query ? (this.matches.length ? `${this.match + 1} of ${this.matches.length} in the lines loaded` : 'not in the lines loaded') : '';
  }

  setStatus(text, isError) {
    this.status.className = isError ? 'error' : 'muted';
    if (text) {
      this.status.textContent = text;
      return;
    }
    const mode = this.previous ? 'previous run' : this.following ? (this.ctrl ? 'following' : 'stopped') : 'tail';
    this.status.textContent = [this.node ? 'node ' + this.node : '', mode, `${this.lines.length.toLocaleString()} lines in view` +
      (this.dropped ? ` (${this.dropped.toLocaleString()} older dropped from the page)` : '')].filter(Boolean).join(' · ');
  }

  // download saves the whole log the node keeps for the source (or its previous run) as a
  // file: fetched with the token into a blob, saved through a link.
  async download() {
    const { path, source } = this.request(-1, false);
    try {
      const res = await this.api.fetchRaw(path);
      const blob = await res.blob();
      const url = URL.createObjectURL(blob);
      const name = `${this.job.name}-${source.value.replace('/', '-')}${this.previous ? '-previous' : ''}.log`;
      const a = h('a', { href: url, download: name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      this.toast(`Saved ${name} (${blob.size.toLocaleString()} bytes).`);
    } catch (e) {
      this.toast('Download failed: ' + e.message, true);
    }
  }
}
