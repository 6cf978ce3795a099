// edge-pulse dashboard: polls the JSON API once a second and redraws.
// Plain DOM, no framework, no outside host. Data is only ever set with textContent.
'use strict';

(() => {
  const REFRESH_MS = 1000;
  const MODEL_REFRESH_MS = 30000;
  const HEAT_ROWS = 20;
  const DECISIONS = 20;
  const BINS = 6;

  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  // With `pulse serve --api-token` the API needs a bearer token: typed into the form
  // the page shows on a 401, or passed once as /#token=... It is kept for this tab
  // only (sessionStorage) and taken out of the address bar.
  const TOKEN_KEY = 'pulse-api-token';
  const fromHash = new URLSearchParams(location.hash.slice(1)).get('token');
  if (fromHash) {
    sessionStorage.setItem(TOKEN_KEY, fromHash);
    history.replaceState(null, '', location.pathname + location.search);
  }
  let token = sessionStorage.getItem(TOKEN_KEY);

  const view = {
    tenant: params.get('tenant') || '',
    window: params.get('window') || '60s',
    paused: false,
    regions: [],
    modelAt: 0,
  };

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  class HttpError extends Error {
    constructor(status, body) {
      super((body && body.message) || `HTTP ${status}`);
      this.status = status;
      this.code = body && body.error;
    }
  }

  async function api(path) {
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    const response = await fetch(path, { headers, signal: AbortSignal.timeout(4000) });
    let body = null;
    try { body = await response.json(); } catch (_) { /* not JSON */ }
    if (!response.ok) throw new HttpError(response.status, body);
    return body;
  }

  const fmt = {
    rate(v) {
      if (v >= 100) return Math.round(v).toString();
      if (v >= 10) return v.toFixed(1);
      return v.toFixed(2).replace(/\.?0+$/, '') || '0';
    },
    time(ms) { return new Date(ms).toISOString().slice(11, 23); },
    stamp(ms) { return new Date(ms).toISOString().replace('T', ' ').slice(0, 19) + ' UTC'; },
    pct(v) { return `${(v * 100).toFixed(1)} %`; },
    num(v, digits = 3) { return Number(v).toFixed(digits); },
    secs(ms) { return `${(ms / 1000).toFixed(1)} s`; },
  };

  function windowSeconds(w) {
    return { '200ms': 0.2, '1s': 1, '10s': 10, '60s': 60 }[w] || 1;
  }

  function saveView() {
    const q = new URLSearchParams({ tenant: view.tenant, window: view.window });
    history.replaceState(null, '', `?${q}${location.hash}`);
  }

  // ---- tenants and status -------------------------------------------------

  function renderTenants(data) {
    const select = $('tenant');
    const names = data.tenants.map((t) => t.tenant);
    if (!view.tenant || !names.includes(view.tenant)) {
      // Default to the busiest tenant: that is where the action is.
      const busiest = data.tenants.slice().sort((a, b) => b.events - a.events)[0];
      view.tenant = busiest ? busiest.tenant : '';
    }
    const current = Array.from(select.options).map((o) => o.value);
    if (current.join('\n') !== names.join('\n')) {
      select.replaceChildren(...data.tenants.map((t) => {
        const option = el('option', `${t.tenant} (${t.events.toLocaleString('en')} events)`);
        option.value = t.tenant;
        return option;
      }));
    } else {
      data.tenants.forEach((t, i) => {
        select.options[i].textContent = `${t.tenant} (${t.events.toLocaleString('en')} events)`;
      });
    }
    select.value = view.tenant;
    const summary = data.tenants.find((t) => t.tenant === view.tenant);
    view.regions = summary ? summary.regions.slice().sort() : [];
  }

  function setStatus(text, isError) {
    const status = $('status');
    status.textContent = text;
    status.classList.toggle('error', Boolean(isError));
  }

  // ---- heat map -------------------------------------------------------------

  function binOf(v, max) {
    if (!(v > 0) || !(max > 0)) return 0;
    const b = 1 + Math.floor((BINS * Math.log1p(v)) / Math.log1p(max));
    return Math.min(BINS, Math.max(1, b));
  }

  function renderLegend(max) {
    const legend = $('heat-legend');
    const items = [];
    const zero = el('span', null, 'bin');
    zero.append(el('span', null, 'swatch h0'), '0');
    items.push(zero);
    const L = Math.log1p(max);
    for (let b = 1; b <= BINS; b += 1) {
      const lo = Math.expm1(((b - 1) / BINS) * L);
      const hi = Math.expm1((b / BINS) * L);
      const item = el('span', null, 'bin');
      item.append(el('span', null, `swatch h${b}`), `${fmt.rate(lo)}–${fmt.rate(hi)}`);
      items.push(item);
    }
    const title = el('strong', 'events/s:');
    legend.replaceChildren(title, ...items);
  }

  function renderHeatmap(data) {
    const table = $('heatmap');
    const span = Math.max(windowSeconds(data.window), 1);
    // Regions: the tenant's, plus any a row names that the summary did not have yet.
    const regions = view.regions.slice();
    for (const row of data.keys) {
      for (const r of row.regions) if (!regions.includes(r.region)) regions.push(r.region);
    }
    let max = 0;
    const cells = data.keys.map((row) => {
      const byRegion = new Map(row.regions.map((r) => [r.region, r.count / span]));
      const values = regions.map((r) => byRegion.get(r) || 0);
      for (const v of values) max = Math.max(max, v);
      return values;
    });

    const head = el('tr');
    head.append(el('th', 'Key', 'key'), el('th', `events/s (${data.window})`), el('th', 'misses'));
    for (const r of regions) {
      const th = el('th', r);
      th.scope = 'col';
      head.append(th);
    }
    head.querySelectorAll('th').forEach((th) => { th.scope = 'col'; });
    table.tHead.replaceChildren(head);

    const velocityKey = data.window;
    const rows = data.keys.map((row, i) => {
      const tr = el('tr');
      tr.dataset.key = row.key;
      const key = el('th', row.key, 'key');
      key.scope = 'row';
      key.title = row.key;
      tr.append(
        key,
        el('td', fmt.rate(row.velocities[velocityKey])),
        el('td', row.misses.toLocaleString('en')),
      );
      cells[i].forEach((v, j) => {
        const b = binOf(v, max);
        const td = el('td', v > 0 ? fmt.rate(v) : '·', `heat h${b}`);
        td.dataset.region = regions[j];
        td.title = `${row.key} in ${regions[j]}: ${fmt.rate(v)} events/s`;
        tr.append(td);
      });
      return tr;
    });
    table.tBodies[0].replaceChildren(...rows);
    $('heat-caption').textContent = data.keys.length
      ? `${data.tenant}: ${data.keys.length} hottest keys over ${data.window}, ending ${fmt.stamp(data.now_ms)}`
      : `${data.tenant}: no events in the last ${data.window} (ending ${fmt.stamp(data.now_ms)})`;
    renderLegend(max);
    table.dataset.tenant = data.tenant;
    table.dataset.window = data.window;
    table.dataset.nowMs = String(data.now_ms);
  }

  // ---- load chart -----------------------------------------------------------

  const CHART = { w: 600, h: 220, left: 44, right: 8, top: 10, bottom: 22 };

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function renderRates(data) {
    const svg = $('chart');
    const ns = svg.namespaceURI;
    const pts = data.seconds;
    const top = niceMax(Math.max(1, ...pts.map((p) => p.events)));
    const plotW = CHART.w - CHART.left - CHART.right;
    const plotH = CHART.h - CHART.top - CHART.bottom;
    const x = (i) => CHART.left + (plotW * i) / Math.max(1, pts.length - 1);
    const y = (v) => CHART.top + plotH - (plotH * v) / top;

    const grid = svg.querySelector('.grid');
    const lines = [];
    for (let k = 0; k <= 4; k += 1) {
      const v = (top * k) / 4;
      const line = document.createElementNS(ns, 'line');
      line.setAttribute('x1', CHART.left);
      line.setAttribute('x2', CHART.w - CHART.right);
      line.setAttribute('y1', y(v));
      line.setAttribute('y2', y(v));
      const label = document.createElementNS(ns, 'text');
      label.setAttribute('x', CHART.left - 6);
      label.setAttribute('y', y(v) + 4);
      label.setAttribute('text-anchor', 'end');
      label.textContent = fmt.rate(v);
      lines.push(line, label);
    }
    for (const [i, text] of [[0, '−60 s'], [30, '−30 s'], [pts.length - 1, 'now']]) {
      const label = document.createElementNS(ns, 'text');
      label.setAttribute('x', x(i));
      label.setAttribute('y', CHART.h - 6);
      label.setAttribute('text-anchor', i === 0 ? 'start' : i === 30 ? 'middle' : 'end');
      label.textContent = text;
      lines.push(label);
    }
    grid.replaceChildren(...lines);
    const poly = (field) => pts.map((p, i) => `${x(i).toFixed(1)},${y(p[field]).toFixed(1)}`).join(' ');
    svg.querySelector('.line.events').setAttribute('points', poly('events'));
    svg.querySelector('.line.misses').setAttribute('points', poly('misses'));
    // The current second is partial: quote the last complete one.
    const last = pts.length >= 2 ? pts[pts.length - 2] : pts[pts.length - 1];
    $('events-now').textContent = last ? fmt.rate(last.events) : '–';
    $('misses-now').textContent = last ? fmt.rate(last.misses) : '–';
    $('load-note').textContent =
      `Summed over ${data.keys} hottest keys of ${data.tenant}, by event time (sketch estimates).`;
    svg.dataset.tenant = data.tenant;
  }

  // ---- edges by kind ----------------------------------------------------------

  // The three kinds always, side by side; `other` and `unspecified` only with events.
  const EDGE_KINDS = ['prefetcher', 'nginx', 'varnish'];
  const EDGE_LABELS = {
    prefetcher: 'prefetcher', nginx: 'nginx', varnish: 'Varnish',
    other: 'other', unspecified: 'unspecified',
  };
  const EDGE_ROWS = [
    ['events', 'Events', (e) => e.events.toLocaleString('en')],
    ['hit_ratio', 'Hit ratio', (e) => (e.hit_ratio === null ? '–' : fmt.pct(e.hit_ratio))],
    ['rate_per_s', 'Events/s', (e) => fmt.rate(e.rate_per_s)],
    ['nodes', 'Nodes', (e) => `${e.nodes}${e.nodes_capped ? '+' : ''}`],
    ['bytes', 'Bytes sent', (e) => e.bytes.toLocaleString('en')],
  ];

  function renderEdges(data) {
    const shown = data.edges.filter((e) => EDGE_KINDS.includes(e.edge) || e.events > 0);
    const table = $('edges-table');
    const head = el('tr');
    head.append(el('th', 'Kind'));
    for (const e of shown) {
      const th = el('th', EDGE_LABELS[e.edge] || e.edge);
      th.dataset.edge = e.edge;
      head.append(th);
    }
    head.querySelectorAll('th').forEach((th) => { th.scope = 'col'; });
    table.tHead.replaceChildren(head);
    const rows = EDGE_ROWS.map(([field, label, show]) => {
      const tr = el('tr');
      tr.dataset.field = field;
      const th = el('th', label);
      th.scope = 'row';
      tr.append(th);
      for (const e of shown) {
        const td = el('td', show(e));
        td.dataset.edge = e.edge;
        td.dataset.value = String(e[field]);
        tr.append(td);
      }
      return tr;
    });
    table.tBodies[0].replaceChildren(...rows);
    $('edges-note').textContent =
      `Every tenant, since pulse started; events/s over the last ${data.rate_window_s} s and ` +
      `nodes over the last ${data.node_window_s} s of event time, ending ${fmt.stamp(data.now_ms)}.`;
    table.dataset.nowMs = String(data.now_ms);
  }

  // ---- fleet ----------------------------------------------------------------

  // What this answer covers: every partition of the topic, or which are missing and
  // which peers did not answer. An incomplete answer is said so, never shown as whole.
  function renderCoverage(coverage) {
    const note = $('coverage');
    if (!coverage) return;
    const have = coverage.partitions.length;
    const all = coverage.partition_count;
    let text = `Coverage: ${have} of ${all} partitions`;
    if (coverage.complete) {
      text += ' — complete.';
    } else {
      const covered = new Set(coverage.partitions);
      const missing = [];
      for (let p = 0; p < all; p += 1) if (!covered.has(p)) missing.push(p);
      text += ` — INCOMPLETE: partitions ${missing.join(', ') || '–'} missing`;
      if ((coverage.replaying || []).length) text += `; partitions ${coverage.replaying.join(', ')} replaying (counts partial until they catch up)`;
      if (coverage.missing_peers.length) text += `; no answer from ${coverage.missing_peers.join(', ')}`;
      text += '.';
    }
    note.textContent = text;
    note.dataset.complete = String(coverage.complete);
    note.classList.toggle('error', !coverage.complete);
  }

  // This instance's own partitions, from /healthz (open, like /metrics).
  function renderFleet(health) {
    const rows = (health.partitions || []).map((p) => {
      const tr = el('tr');
      tr.dataset.partition = String(p.partition);
      tr.append(el('td', p.partition), el('td', p.next_offset), el('td', p.live_from),
        el('td', p.lag ?? '–'), el('td', p.replaying ? 'replaying' : 'live'));
      return tr;
    });
    $('fleet-table').tBodies[0].replaceChildren(...rows);
    const peers = (health.peers || []).length;
    $('fleet-title').textContent = `Fleet · this instance owns ${rows.length} of ` +
      `${health.partition_count ?? '–'} partitions · ${peers} peer${peers === 1 ? '' : 's'}` +
      (health.model ? ` · model ${health.model}` : '');
  }

  // ---- decisions ------------------------------------------------------------

  const TOP_FEATURES = 5;

  // The largest contributions as bars; the rest behind a disclosure.
  function featureBars(features) {
    const max = Math.max(1e-9, ...features.map((f) => Math.abs(f.contribution)));
    const top = featureGrid(features.slice(0, TOP_FEATURES), max);
    if (features.length <= TOP_FEATURES) return top;
    const more = el('details');
    more.append(el('summary', `${features.length - TOP_FEATURES} more`),
      featureGrid(features.slice(TOP_FEATURES), max));
    const box = el('div');
    box.append(top, more);
    return box;
  }

  function featureGrid(features, max) {
    const box = el('div', null, 'features');
    for (const f of features) {
      const bar = el('span', null, 'bar');
      const fill = el('span', null, f.contribution >= 0 ? 'pos' : 'neg');
      fill.style.width = `${(50 * Math.abs(f.contribution)) / max}%`;
      bar.append(fill);
      bar.title = `${f.name} = ${fmt.num(f.value)}; contribution ${fmt.num(f.contribution)}`;
      const sign = f.contribution >= 0 ? '+' : '−';
      box.append(el('span', f.name, 'name'), bar, el('span', `${sign}${fmt.num(Math.abs(f.contribution))}`, 'val'));
    }
    return box;
  }

  function renderPredictions(data) {
    const t = data.totals;
    const skipped = Object.entries(t.skipped).map(([k, v]) => `${k.replace(/_/g, ' ')} ${v}`).join(', ');
    $('pred-totals').textContent =
      `Since start: ${t.sent} sent, ${t.useful} useful, ${t.wasted} wasted; ${t.scored} keys scored; skipped: ${skipped || 'none'}.`;
    const rows = data.decisions.map((d) => {
      const tr = el('tr');
      tr.dataset.id = d.id;
      tr.dataset.key = d.key;
      tr.dataset.verdict = d.verdict;
      const leads = d.lead_times.length
        ? d.lead_times.map((l) => `${l.region} ${fmt.secs(l.ms)}`).join(', ')
        : '–';
      const confidence = el('td', fmt.pct(d.confidence));
      const features = el('td');
      features.append(featureBars(d.features));
      tr.append(
        el('td', fmt.time(d.issued_at_ms)),
        el('td', d.tenant),
        el('td', d.key, 'key'),
        confidence,
        el('td', d.regions.join(', ')),
        el('td', d.verdict, `verdict ${d.verdict}`),
        el('td', leads),
        features,
      );
      return tr;
    });
    fillTable('decisions', rows, 'No pre-warm decision yet.');
  }

  // ---- warm-ups --------------------------------------------------------------

  function renderWarmups(data) {
    const rows = data.warmups.map((w) => {
      const p = w.progress;
      const tr = el('tr');
      tr.dataset.id = w.id;
      tr.dataset.phase = p.phase;
      const regions = el('td', null, 'regions');
      for (const [region, r] of Object.entries(p.regions)) {
        const line = el('div', null, 'warm-region');
        line.dataset.region = region;
        line.dataset.filled = r.filled;
        line.dataset.cached = r.cached;
        const bar = el('progress');
        bar.max = Math.max(1, p.keys);
        bar.value = r.filled + r.cached;
        line.append(el('span', region, 'name'), bar,
          el('span', `${r.filled} filled + ${r.cached} cached of ${p.keys}`, 'val'));
        regions.append(line);
      }
      if (!regions.childElementCount) regions.textContent = 'no report yet';
      tr.append(
        el('td', w.id, 'key'),
        el('td', w.tenant),
        el('td', p.phase === 'waiting' ? `waiting until ${fmt.stamp(w.not_before)}` : p.phase),
        el('td', `${p.sent} / ${p.keys}`),
        el('td', p.failed),
        regions,
      );
      return tr;
    });
    fillTable('warm-table', rows, 'No warm-up on this instance.');
  }

  // A table's rows, or one row across all its columns saying why there is none.
  function fillTable(id, rows, none) {
    const table = $(id);
    if (!rows.length) {
      const td = el('td', none);
      td.colSpan = table.tHead.rows[0].cells.length;
      const tr = el('tr');
      tr.append(td);
      rows.push(tr);
    }
    table.tBodies[0].replaceChildren(...rows);
  }

  function predictionOff(section, message) {
    section.replaceChildren(el('p', message, 'note'));
  }

  // ---- model card -----------------------------------------------------------

  function renderModel(m) {
    const facts = el('dl', null, 'card-facts');
    const add = (k, v) => facts.append(el('dt', k), el('dd', v));
    add('Model', m.name);
    add('Trained', m.trained_at_ms ? fmt.stamp(m.trained_at_ms) : 'built in');
    add('Samples', `${m.samples.toLocaleString('en')} (${m.positives.toLocaleString('en')} viral)`);
    add('R²', fmt.num(m.r2));
    add(`Train @ ${m.train.threshold}`, `precision ${fmt.num(m.train.precision)}, recall ${fmt.num(m.train.recall)}`);
    if (m.held_out) {
      add(`Held out @ ${m.held_out.threshold}`, `precision ${fmt.num(m.held_out.precision)}, recall ${fmt.num(m.held_out.recall)}`);
    }
    add('Threshold', m.threshold);
    add('Cooldown / TTL', `${fmt.secs(m.cooldown_ms)} / ${fmt.secs(m.command_ttl_ms)}`);
    add('Budget', `${m.tenant_rate_per_s}/s per tenant, burst ${m.tenant_burst}`);
    add('Calibration', `σ(${fmt.num(m.calibration_slope)} · y + ${fmt.num(m.calibration_offset)}), intercept ${fmt.num(m.intercept)}`);

    const table = el('table');
    table.append(el('caption', 'Features (coefficients on standardised values)'));
    const head = el('tr');
    for (const h of ['Feature', 'Transform', 'Coefficient', 'Mean', 'Std']) {
      const th = el('th', h);
      th.scope = 'col';
      head.append(th);
    }
    table.createTHead().append(head);
    const body = table.createTBody();
    for (const f of m.features) {
      const tr = el('tr');
      tr.append(el('td', f.name, 'key'), el('td', f.transform), el('td', fmt.num(f.coefficient)),
        el('td', fmt.num(f.mean)), el('td', fmt.num(f.std)));
      body.append(tr);
    }
    const scroll = el('div', null, 'scroll');
    scroll.append(table);
    $('model-body').replaceChildren(facts, scroll);
    $('model').dataset.model = m.name;
  }

  // ---- the loop ---------------------------------------------------------------

  async function refresh() {
    const tenants = await api('/api/tenants');
    renderTenants(tenants);
    renderCoverage(tenants.coverage);
    try { renderFleet(await api('/healthz')); } catch (_) { /* shown by the next round */ }
    if (!view.tenant) {
      setStatus(`Waiting for events · ${fmt.stamp(Date.now())}`);
      return;
    }
    saveView();
    // One event time for every question, so a fleet answer's windows all end there.
    const q = `tenant=${encodeURIComponent(view.tenant)}&now_ms=${tenants.now_ms}`;
    const w = view.window;
    const [heat, rates, preds, edges, warmups] = await Promise.allSettled([
      api(`/api/heatmap?${q}&window=${encodeURIComponent(w)}&n=${HEAT_ROWS}`),
      api(`/api/rates?${q}`),
      api(`/api/predictions?limit=${DECISIONS}`),
      api('/api/edges'),
      api('/api/warm'),
    ]);
    // A selection changed while the requests ran: draw the next round instead.
    if (view.tenant !== heat.value?.tenant && heat.status === 'fulfilled') return;
    if (heat.status === 'rejected') throw heat.reason;
    if (w === view.window) renderHeatmap(heat.value);
    if (rates.status === 'fulfilled') renderRates(rates.value);
    if (edges.status === 'fulfilled') renderEdges(edges.value);
    if (warmups.status === 'fulfilled') renderWarmups(warmups.value);
    if (preds.status === 'fulfilled') {
      renderPredictions(preds.value);
    } else if (preds.reason.code === 'prediction_off') {
      predictionOff($('predictions').querySelector('.scroll'), 'Prediction is off in this pulse (--no-prewarm).');
    }
    if (Date.now() - view.modelAt > MODEL_REFRESH_MS) {
      try {
        renderModel(await api('/api/model'));
        view.modelAt = Date.now();
      } catch (e) {
        if (e.code === 'prediction_off') {
          predictionOff($('model-body'), 'No model: prediction is off.');
          view.modelAt = Date.now();
        }
      }
    }
    setStatus(`Event time ${fmt.stamp(tenants.now_ms)} · ${tenants.tenants.length} tenants · ` +
      `error ≤ ${fmt.pct(tenants.error_bound)} of a window's events · updated ${new Date().toLocaleTimeString('en-GB')}`);
  }

  let timer = null;
  let running = false;
  let again = false;
  async function tick() {
    clearTimeout(timer);
    // One round at a time; a selection made during a round gets a round of its own.
    if (running) { again = true; return; }
    running = true;
    again = false;
    try {
      await refresh();
    } catch (e) {
      if (e.status === 401) {
        $('token-form').hidden = false;
        setStatus(token ? 'The API token was refused: enter the right one.'
          : 'This pulse needs an API token (pulse serve --api-token).', true);
      } else {
        setStatus(`Cannot reach the API: ${e.message}. Retrying…`, true);
      }
    } finally {
      running = false;
      if (again) timer = setTimeout(tick, 0);
      else if (!view.paused) timer = setTimeout(tick, REFRESH_MS);
    }
  }

  function start() {
    $('token-form').addEventListener('submit', (e) => {
      e.preventDefault();
      token = $('token').value.trim();
      sessionStorage.setItem(TOKEN_KEY, token);
      $('token').value = '';
      $('token-form').hidden = true;
      setStatus('Connecting…');
      tick();
    });
    $('window').value = view.window;
    $('tenant').addEventListener('change', (e) => { view.tenant = e.target.value; tick(); });
    $('window').addEventListener('change', (e) => { view.window = e.target.value; tick(); });
    $('pause').addEventListener('click', (e) => {
      view.paused = !view.paused;
      e.target.setAttribute('aria-pressed', String(view.paused));
      e.target.textContent = view.paused ? 'Resume' : 'Pause';
      if (!view.paused) tick();
    });
    tick();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
