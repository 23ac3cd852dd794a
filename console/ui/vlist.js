// A virtual list: rows of one height in a scrolling box, of which only those in view (and a
// few around) are in the DOM. The events and the log views hold thousands of rows this
// way at the cost of a few dozen elements.

const OVERSCAN = 10;

export class VirtualList {
  // root is the scrolling element; rowHeight in pixels; count() says how many rows there
  // are and row(i) draws row i (an element, positioned here). onScroll(atEnd) hears when
  // the user scrolls, and whether the end is in view.
  constructor(root, { rowHeight, count, row, onScroll }) {
    this.root = root;
    this.rowHeight = rowHeight;
    this.count = count;
    this.row = row;
    this.onScroll = onScroll || (() => {});
    this.first = -1;
    this.last = -1;
    this.n = -1;
    this.stick = true; // keep the end in view as rows are added
    this.frame = 0;
    this.spacer = document.createElement('div');
    this.spacer.className = 'vspacer';
    root.replaceChildren(this.spacer);
    root.classList.add('vlist');
    root.addEventListener('scroll', () => {
      this.stick = this.atEnd();
      this.onScroll(this.stick);
      this.draw(false);
    }, { passive: true });
    root.addEventListener('keydown', (e) => this.key(e));
    this.resize = new ResizeObserver(() => this.draw(true));
    this.resize.observe(root);
  }

  atEnd() {
    return this.root.scrollTop + this.root.clientHeight >= this.root.scrollHeight - this.rowHeight;
  }

  // refresh draws again after rows were added, removed or changed (at most once a frame);
  // with stick set the end stays in view.
  refresh() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw(true);
    });
  }

  // draw puts the rows in view in the DOM; force redraws them even when the same rows are
  // in view (their content changed).
  draw(force) {
    const n = this.count();
    const h = this.rowHeight;
    if (n !== this.n) {
      this.spacer.style.height = n * h + 'px';
      this.n = n;
      force = true;
    }
    if (this.stick && force) this.root.scrollTop = this.root.scrollHeight;
    const top = this.root.scrollTop;
    const first = Math.max(0, Math.floor(top / h) - OVERSCAN);
    const last = Math.min(n, Math.ceil((top + this.root.clientHeight) / h) + OVERSCAN);
    if (!force && first === this.first && last === this.last) return;
    this.first = first;
    this.last = last;
    const rows = [];
    for (let i = first; i < last; i++) {
      const el = this.row(i);
      el.style.top = i * h + 'px';
      el.dataset.row = i;
      rows.push(el);
    }
    this.spacer.replaceChildren(...rows);
  }

  // show scrolls row i into the middle of the view.
  show(i) {
    this.stick = false;
    this.root.scrollTop = Math.max(0, i * this.rowHeight - this.root.clientHeight / 2);
    this.draw(true);
  }

  toEnd() {
    this.stick = true;
    this.root.scrollTop = this.root.scrollHeight;
    this.draw(true);
  }

  // key lets the keyboard scroll the list: arrows by a row, Page Up/Down by a page,
  // Home and End.
  key(e) {
    if (e.target !== this.root) return;
    const h = this.rowHeight;
    const page = Math.max(h, this.root.clientHeight - h);
    const moves = { ArrowDown: h, ArrowUp: -h, PageDown: page, PageUp: -page };
    if (e.key in moves) this.root.scrollTop += moves[e.key];
    else if (e.key === 'Home') this.root.scrollTop = 0;
    else if (e.key === 'End') this.toEnd();
    else return;
    e.preventDefault();
  }

  // stop releases what watches the list.
  stop() {
    this.resize.disconnect();
    if (this.frame) cancelAnimationFrame(this.frame);
  }
}
