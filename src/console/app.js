// kinbox console: the page's script. Every value shown comes from the
// JSON endpoints and is written with textContent (never innerHTML), so a
// payload or header holding markup stays text. Actions are POSTs with the
// bearer token in a header; the page refreshes at most every 2 s.
'use strict';
(function () {
  const REFRESH_MS = 2000;
  const $ = (id) => document.getElementById(id);
  const state = { view: 'consumers', actions: false, dead: { before: 0, stack: [] }, detail: null, as: 'text' };

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function row(tbody, cells) {
    const tr = document.createElement('tr');
    for (const c of cells) {
      if (c instanceof Node) { const td = document.createElement('td'); td.appendChild(c); tr.appendChild(td); }
      else if (c && typeof c === 'object') { tr.appendChild(el('td', c.v, c.cls)); }
      else tr.appendChild(el('td', c === null || c === undefined ? '-' : c));
    }
    tbody.appendChild(tr);
    return tr;
  }
  function clear(tbodyId) { const t = $(tbodyId).tBodies[0]; t.replaceChildren(); return t; }
  function num(v, digits) {
    if (v === null || v === undefined) return { v: '-', cls: 'num' };
    return { v: digits === undefined ? String(v) : Number(v).toFixed(digits), cls: 'num' };
  }
  function result(text, bad) { const s = $('result'); s.textContent = text; s.className = bad ? 'bad' : ''; }
  function status(text, bad) { const s = $('status'); s.textContent = text; s.className = bad ? 'err' : ''; }

  async function get(path) {
    const r = await fetch('/console/api/' + path, { credentials: 'same-origin', cache: 'no-store' });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error || ('HTTP ' + r.status));
    return j;
  }
  async function post(path) {
    const headers = { 'Authorization': 'Bearer ' + $('token').value };
    const op = $('operator').value;
    if (op) headers['X-Kinbox-Operator'] = op;
    const r = await fetch('/console/api/' + path, { method: 'POST', headers, credentials: 'same-origin', cache: 'no-store' });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error || ('HTTP ' + r.status));
    return j;
  }
  function q(params) {
    const u = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== '' && v !== null && v !== undefined) u.set(k, v);
    const s = u.toString();
    return s ? '?' + s : '';
  }

  // A confirmation, then the action; the result in the status line.
  function confirmThen(text, path, after) {
    const d = $('confirm');
    $('confirm-text').textContent = text;
    const yes = $('confirm-yes'), no = $('confirm-no');
    const done = () => { yes.onclick = null; no.onclick = null; d.close(); };
    no.onclick = done;
    yes.onclick = async () => {
      done();
      try {
        const j = await post(path);
        result('done: ' + text + ' ' + JSON.stringify(j), false);
      } catch (e) { result('refused: ' + e.message, true); }
      if (after) after();
      refresh();
    };
    d.showModal();
  }
  function actButton(label, text, path, after) {
    const b = el('button', label, 'act');
    b.type = 'button';
    b.disabled = !state.actions;
    b.title = state.actions ? '' : 'read-only: no console.token_file';
    b.dataset.action = path;
    b.onclick = () => confirmThen(text, path, after);
    return b;
  }

  function renderConsumers(ov) {
    const t = clear('consumers'), p = clear('partitions');
    for (const c of ov.consumers) {
      const err = c.last_error ? ('#' + c.last_error.dead_letter + ' ' + (c.last_error.error || '(binary)')) : '';
      const tr = row(t, [c.name, c.group, num(c.assigned_partitions), num(c.lag), num(c.msgs_per_s, 1),
        num(c.dedup_hits), num(c.business_duplicates), num(c.batch_size_mean, 1), num(c.dead),
        num(c.held_keys), num(c.parked), { v: err, cls: 'err' }]);
      tr.dataset.consumer = c.name;
      for (const x of c.partitions) row(p, [c.name, x.topic, num(x.partition), num(x.lag)]);
    }
  }
  function renderOutbox(ov) {
    const r = ov.relay;
    $('relay').textContent = r.enabled
      ? 'Relay: ' + r.source + ', published ' + (r.published ?? 0) + ', failed ' + (r.failed ?? 0) + ', dead ' + (r.dead ?? 0) +
        (r.slot_lag_bytes !== null && r.slot_lag_bytes !== undefined ? ', slot lag ' + r.slot_lag_bytes + ' bytes' : '') +
        (r.wal_status ? ' (' + r.wal_status + ')' : '')
      : 'Relay: not run by this process';
    const t = clear('outbox');
    for (const o of ov.outbox) {
      const acts = document.createElement('span');
      acts.appendChild(o.paused
        ? actButton('Resume', 'Resume destination ' + o.destination + '?', 'outbox/resume' + q({ destination: o.destination }))
        : actButton('Pause', 'Pause destination ' + o.destination + '?', 'outbox/pause' + q({ destination: o.destination })));
      const tr = row(t, [o.destination, num(o.pending), num(o.oldest_pending_age_s), num(o.dead), num(o.sent_last_hour), o.paused ? 'yes' : 'no', acts]);
      tr.dataset.dest = o.destination;
    }
  }
  async function renderParked() {
    const j = await get('parked');
    const t = clear('parked');
    for (const x of j.rows) {
      const key = x.key ? (x.key.text ?? ('hex ' + x.key.hex)) : '';
      const mid = x.message_id ? (x.message_id.text ?? ('hex ' + x.message_id.hex)) : '';
      const b = x.blocker ? actButton('Release (discard #' + x.blocker + ')', 'Discard dead letter ' + x.blocker + ' and release its held key?', 'dead/' + x.blocker + '/discard') : el('span', '');
      row(t, [x.consumer, x.topic + ' [' + x.partition + '] ' + x.offset, key, mid, x.blocker, x.parked_at, b]);
    }
  }
  async function renderOutboxRows() {
    const j = await get('outbox' + q({ status: $('ob-status').value, destination: $('ob-dest').value }));
    const t = clear('outbox-rows');
    for (const x of j.rows) {
      const acts = document.createElement('span');
      const again = () => renderOutboxRows().catch((e) => status('error: ' + e.message, true));
      if (x.status === 'dead' || x.status === 'canceled') acts.appendChild(actButton('Requeue', 'Requeue outbox row ' + x.id + '?', 'outbox/' + x.id + '/requeue', again));
      if (x.status === 'pending') acts.appendChild(actButton('Cancel', 'Cancel outbox row ' + x.id + '?', 'outbox/' + x.id + '/cancel', again));
      const tr = row(t, [num(x.id), x.status, x.destination, x.idem_key, num(x.attempts), { v: x.last_error || '', cls: 'err' }, x.created_at, acts]);
      tr.dataset.id = x.id;
    }
  }
  function deadFilter() {
    return { consumer: $('df-consumer').value, topic: $('df-topic').value, status: $('df-status').value };
  }
  async function renderDead() {
    const f = deadFilter();
    const j = await get('dead' + q(Object.assign({ before: state.dead.before || '' }, f)));
    const t = clear('dead');
    for (const x of j.rows) {
      const acts = document.createElement('span');
      const show = el('button', 'Show', 'act'); show.type = 'button'; show.onclick = () => showDetail(x.id);
      acts.appendChild(show);
      if (x.status === 'dead') {
        acts.appendChild(actButton('Replay', 'Replay dead letter ' + x.id + ' with consumer ' + x.consumer + "'s handler?", 'dead/' + x.id + '/replay'));
        acts.appendChild(actButton('Discard', 'Discard dead letter ' + x.id + '?', 'dead/' + x.id + '/discard'));
      }
      const tr = row(t, [num(x.id), x.consumer, x.topic + ' [' + x.partition + '] ' + x.offset, x.message_id ?? '(binary)', x.status, num(x.attempts),
        x.first_failed_at, x.dead_at, num(x.holds_back), { v: x.error ?? '(binary)', cls: 'err' }, acts]);
      tr.dataset.id = x.id;
    }
    state.dead.next = j.next_before;
    $('dead-next').disabled = !j.next_before;
  }
  function payloadView() {
    const p = state.detail && state.detail.payload;
    const pre = $('payload');
    if (!p) { pre.textContent = '(no payload)'; return; }
    let s;
    if (state.as === 'json') s = p.json ?? '(not JSON)';
    else if (state.as === 'hex') s = (p.hex || '').replace(/(..)/g, '$1 ').replace(/((?:.. ){16})/g, '$1\n');
    else s = p.text ?? '(binary: see hex)';
    pre.textContent = s + (p.truncated ? '\n… (truncated; ' + p.size + ' bytes in all)' : '');
    $('payload-size').textContent = '(' + p.size + ' bytes, ' + p.kind + ')';
  }
  async function showDetail(id) {
    const d = await get('dead/' + id);
    state.detail = d;
    state.as = d.payload && d.payload.kind === 'json' ? 'json' : d.payload && d.payload.kind === 'binary' ? 'hex' : 'text';
    $('detail').hidden = false;
    $('detail-title').textContent = 'Dead letter ' + d.id;
    const dl = $('detail-meta'); dl.replaceChildren();
    const meta = [['consumer', d.consumer], ['status', d.status], ['topic [part] offset', d.topic + ' [' + d.partition + '] ' + d.offset],
      ['message id', d.message_id ? (d.message_id.text ?? d.message_id.hex) : ''], ['key', d.key ? (d.key.text ?? 'hex ' + d.key.hex) : '(none)'],
      ['attempts', d.attempts], ['first failed', d.first_failed_at], ['dead at', d.dead_at], ['error', d.error ?? '(binary)']];
    for (const [k, v] of meta) { dl.appendChild(el('dt', k)); dl.appendChild(el('dd', v)); }
    const t = clear('detail-headers');
    for (const h of d.headers) row(t, [h.name ?? '(binary name)', h.value ? (h.value.text ?? 'hex ' + h.value.hex) : '(no value)']);
    payloadView();
    $('detail').scrollIntoView();
  }

  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      if (state.view === 'dead') await renderDead();
      else {
        const ov = await get('overview');
        renderConsumers(ov); renderOutbox(ov);
        if (state.view === 'consumers') await renderParked();
        const dead = ov.consumers.reduce((a, c) => a + (c.dead || 0), 0);
        document.body.dataset.dead = String(dead);
      }
      status('updated ' + new Date().toLocaleTimeString() + (state.actions ? '' : ' (read-only)'));
      document.body.dataset.loaded = '1';
    } catch (e) { status('error: ' + e.message, true); }
    busy = false;
  }
  function show(view) {
    state.view = view;
    for (const v of ['consumers', 'outbox', 'dead']) {
      $('view-' + v).hidden = v !== view;
      $('nav-' + v).classList.toggle('on', v === view);
    }
    refresh();
    if (view === 'outbox') renderOutboxRows().catch((e) => status('error: ' + e.message, true));
  }

  async function start() {
    try { state.actions = (await get('session')).actions; } catch (e) { status('error: ' + e.message, true); }
    for (const b of document.querySelectorAll('nav button')) b.onclick = () => show(b.dataset.view);
    for (const b of document.querySelectorAll('button.as')) b.onclick = () => { state.as = b.dataset.as; payloadView(); };
    $('token-form').onsubmit = (e) => e.preventDefault();
    $('dead-filter').onsubmit = (e) => { e.preventDefault(); state.dead.before = 0; refresh(); };
    $('outbox-filter').onsubmit = (e) => { e.preventDefault(); renderOutboxRows().catch((x) => status('error: ' + x.message, true)); };
    $('dead-first').onclick = () => { state.dead.before = 0; refresh(); };
    $('dead-next').onclick = () => { if (state.dead.next) { state.dead.before = state.dead.next; refresh(); } };
    const sel = (what) => () => {
      const f = deadFilter();
      const max = prompt('How many of the oldest dead letters matching consumer "' + (f.consumer || '*') + '", topic "' + (f.topic || '*') + '" (1-100)?', '10');
      if (!max) return;
      confirmThen(what + ' up to ' + max + ' dead letters of the filter?', 'dead/' + what.toLowerCase() + q({ consumer: f.consumer, topic: f.topic, max }));
    };
    $('sel-replay').onclick = sel('Replay');
    $('sel-discard').onclick = sel('Discard');
    show('consumers');
    setInterval(refresh, REFRESH_MS);
  }
  document.addEventListener('DOMContentLoaded', start);
})();
