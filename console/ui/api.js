// The master's API as the console uses it: JSON calls with the bearer token, and the
// GET /v1/watch stream of server-sent events, read with fetch so that the token goes in a
// header (EventSource cannot send one) rather than in a URL.

export class APIError extends Error {
  // problems are an invalid spec's, one by one: {field, line, msg}.
  constructor(status, msg, code, problems) {
    super(msg);
    this.status = status;
    this.code = code;
    this.problems = problems || [];
  }
}

// errorOf reads an error answer.
async function errorOf(res) {
  let data = null;
  try { data = await res.json(); } catch { /* not JSON */ }
  return new APIError(res.status, (data && data.error) || `${res.status} ${res.statusText}`, data && data.code, data && data.problems);
}

export class API {
  constructor(token) {
    this.token = token;
  }

  async call(method, path, body) {
    const res = await fetch(path, {
      method,
      headers: { Authorization: 'Bearer ' + this.token, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
    const text = await res.text();
    let data;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!res.ok) {
      throw new APIError(res.status, (data && data.error) || `${res.status} ${res.statusText}`, data && data.code, data && data.problems);
    }
    return data;
  }

  // fetchRaw starts a GET whose body the caller reads (a worker's log): it resolves to the
  // response once its headers are in, and throws an APIError for an error answer.
  async fetchRaw(path, signal) {
    const res = await fetch(path, { headers: { Authorization: 'Bearer ' + this.token }, cache: 'no-store', signal });
    if (!res.ok) throw await errorOf(res);
    return res;
  }

  // follow reads a stream of server-sent events (GET path(), made again for every
  // connection) until stopped: on(type, data, bytes, id) gets every event; status(s) hears
  // of the connection: {live: true}, {down: message}, or {refused: message} when the master
  // refuses the request (a 4xx, or an "end" event: the token stopped being valid), after
  // which it stops. It connects again a second after the stream breaks. It returns a
  // function that stops it.
  follow(path, headers, on, status) {
    let stopped = false;
    let ctrl = null;
    const run = async () => {
      while (!stopped) {
        ctrl = new AbortController();
        try {
          const res = await fetch(path(), {
            headers: { Authorization: 'Bearer ' + this.token, Accept: 'text/event-stream', ...headers() },
            cache: 'no-store',
            signal: ctrl.signal,
          });
          if (!res.ok) {
            const err = await errorOf(res);
            if (res.status >= 400 && res.status < 500 && res.status !== 429) {
              status({ refused: err.message });
              return;
            }
            throw err;
          }
          status({ live: true });
          const end = await this.read(res.body, on);
          if (end) {
            status({ refused: end });
            return;
          }
          throw new Error('the stream ended');
        } catch (e) {
          if (stopped) return;
          status({ down: e.message || String(e) });
        }
        await new Promise((r) => setTimeout(r, 1000));
      }
    };
    run();
    return () => {
      stopped = true;
      if (ctrl) ctrl.abort();
    };
  }

  // events follows GET /v1/events?follow=true (params: a URLSearchParams of the filters and
  // limit): on(event) gets each event, status(s) hears of the connection (see follow).
  // After a break it asks again with Last-Event-ID and without the limit, so the stream
  // continues after the last event it passed on and misses none kept; after, when given,
  // is the id of the last event the caller already has.
  events(params, on, status, after) {
    let last = after ? String(after) : '';
    const path = () => {
      const q = new URLSearchParams(params);
      q.set('follow', 'true');
      if (last) q.delete('limit');
      return '/v1/events?' + q;
    };
    return this.follow(path, () => (last ? { 'Last-Event-ID': last } : {}), (type, msg, size, id) => {
      if (id) last = id;
      on(msg);
    }, status);
  }

  // watch streams the cluster map: on(type, data, bytes) gets every snapshot and delta;
  // status(s) hears of the connection (see follow). After a break it starts again from a
  // snapshot.
  watch(on, status) {
    return this.follow(() => '/v1/watch', () => ({}), on, status);
  }

  // read parses server-sent events until the body ends, passing on each one's type, data
  // (JSON), size and id; it returns the reason of an "end" event, if one came.
  async read(body, on) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return null;
      buf += value;
      // Frames are cut from the chunk by position, the rest kept once: a chunk of a
      // thousand events is not copied a thousand times.
      let at = 0;
      let i;
      while ((i = buf.indexOf('\n\n', at)) >= 0) {
        const frame = buf.slice(at, i);
        at = i + 2;
        let event = 'message';
        let id = '';
        const data = [];
        for (const line of frame.split('\n')) {
          if (line.startsWith('event:')) event = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
          else if (line.startsWith('id:')) id = line.slice(3).trim();
        }
        if (!data.length) continue;
        const text = data.join('\n');
        const msg = JSON.parse(text);
        if (event === 'end') return msg.error || 'the stream was closed';
        on(event, msg, frame.length + 2, id);
      }
      buf = at ? buf.slice(at) : buf;
    }
  }
}
