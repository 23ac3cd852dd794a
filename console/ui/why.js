// Why a job's workers are where they are not: for unplaced workers, the placement engine's
// explanation check by check (how many nodes failed each, first and at all); for nodes that
// avoid the job after its workers crash-looped there, since and until when, and how to end
// it. From the job's status (GET /v1/jobs/{name}: why, avoided).

import { h, fill, ago, plural } from './dom.js';

function at(t) {
  return h('time', { datetime: t, title: new Date(t).toLocaleString() }, new Date(t).toLocaleString());
}

function inTime(t) {
  const ms = new Date(t).getTime() - Date.now();
  if (ms <= 0) return 'now';
  const m = Math.round(ms / 60000);
  return m < 1 ? 'in under a minute' : m < 90 ? `in ${m} min` : `in ${Math.round(m / 60)} h`;
}

// why draws the Why tab: st is the job's status, act the actions (act.admin, act.endAvoid).
export function why(el, j, st, act) {
  if (!st) {
    fill(el, h('p', { class: 'muted' }, 'Loading…'));
    return;
  }
  if (st.error) {
    fill(el, h('p', { class: 'error' }, st.error));
    return;
  }
  const parts = [];
  const groups = st.why || [];
  parts.push(h('h3', null, 'Unplaced workers'));
  if (!groups.length) {
    parts.push(h('p', { class: 'muted' }, 'Every worker of the job has a node.'));
  }
  for (const g of groups) {
    const who = `${plural(g.workers.length, 'worker')} ${g.link ? 'of link ' + g.link + ' ' : ''}(${g.workers.join(', ')})`;
    const sec = [h('h4', null, who)];
    if (g.rejected && g.rejected.length) {
      sec.push(h('p', null, `The placement engine checked every node: `, h('b', null, `${g.fit} of ${g.total} nodes fit`),
        ` a worker of this ${g.link ? 'link' : 'job'} now. Each node is counted under the first check it fails (in the engine's order); the last column counts every node that fails the check at all.`));
      const max = Math.max(1, g.total);
      sec.push(h('table', { class: 'why' },
        h('thead', null, h('tr', null, h('th', { scope: 'col' }, 'Check'), h('th', { scope: 'col', class: 'num' }, 'Nodes failing it first'),
          h('th', { scope: 'col', class: 'num' }, 'Nodes failing it at all'), h('th', { scope: 'col' }, ''))),
        h('tbody', null, g.rejected.map((r) => {
          const fillEl = h('span');
          fillEl.style.width = Math.round((r.nodes / max) * 100) + '%';
          return h('tr', { dataset: { check: r.check } }, h('td', null, r.text), h('td', { class: 'num' }, String(r.nodes)),
            h('td', { class: 'num' }, String(r.failing)), h('td', null, h('span', { class: 'bar', role: 'img', 'aria-label': `${r.nodes} of ${g.total} nodes` }, fillEl)));
        }))));
      sec.push(h('p', { class: 'muted' }, hint(g.rejected)));
    } else {
      sec.push(h('p', null, g.reason));
    }
    parts.push(h('section', { class: 'why-group', dataset: { link: g.link || '', workers: g.workers.join(',') } }, sec));
  }

  parts.push(h('h3', null, 'Nodes that avoid the job'));
  const av = st.avoided || [];
  if (!av.length) {
    parts.push(h('p', { class: 'muted' }, 'No node avoids the job: none saw its workers crash-loop lately.'));
  } else {
    parts.push(h('p', { class: 'muted' }, 'A node where a worker of the job kept crashing avoids the job for a while, longer after each crash loop there (up to the masters\' --avoid-max). The job\'s workers go there only when they fit nowhere else.'));
    parts.push(h('table', { class: 'avoided' },
      h('thead', null, h('tr', null, ['Node', 'Since', 'Until', 'Crash loops there', 'How to end it'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', null, av.map((a) => h('tr', { dataset: { node: a.node } },
        h('td', null, h('a', { href: '#/node/' + encodeURIComponent(a.node) }, a.node)),
        h('td', null, a.since ? [at(a.since), h('div', { class: 'muted' }, ago(a.since))] : h('span', { class: 'muted' }, 'not recorded')),
        h('td', null, at(a.until), h('div', { class: 'muted' }, inTime(a.until))),
        h('td', { class: 'num' }, String(a.strikes)),
        h('td', null, `It ends by itself ${inTime(a.until)}. `,
          act.admin
            ? h('button', { type: 'button', class: 'quiet', onclick: () => act.endAvoid(j.name, a.node) }, 'End it now…')
            : ['An admin can end it now: ', h('code', null, `stormdock node undrain ${a.node} --job ${j.name}`)]))))));
  }
  fill(el, parts);
}

// hint says what would help, from the check most nodes fail first.
function hint(rejected) {
  const top = rejected[0];
  if (!top) return '';
  const hints = {
    slots: 'Every fitting node is full: add nodes, or scale other jobs in.',
    memory: 'Nodes lack memory for a worker: lower resources.memory, or add nodes.',
    cpu: 'Nodes lack cpu for a worker: lower resources.cpu, or add nodes.',
    label: 'Nodes lack a label the job asks for: label nodes, or change placement.nodeLabels.',
    dc: 'Nodes are outside placement.dcs: widen it.',
    'link-dc': 'A link runs in its data center alone: that data center lacks room.',
    'max-per-node': 'placement.maxPerNode is reached on every node: raise it, or add nodes.',
    draining: 'Nodes are draining: undrain them, or add nodes.',
    throttled: 'Nodes withhold slots under memory pressure (see the map): the pressure must ease first.',
    avoided: 'Nodes avoid the job after its workers crash-looped there (below).',
    'not-pool': 'The tenant owns a pool of nodes and may use only those.',
    'other-pool': 'Nodes belong to another tenant\'s pool.',
    unschedulable: 'Nodes are unschedulable (lost data center, failed health).',
  };
  return hints[top.check] ? 'Most nodes fail "' + top.text + '" first. ' + hints[top.check] : '';
}

