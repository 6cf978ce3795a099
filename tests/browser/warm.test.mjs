// A warm-up's progress on the dashboard (issue #55), in headless Chromium: pulse with
// its embedded broker, a tenant made known by a few user events, a warm-up of its
// `/launch/` keys asked through the API, then the edges' reports (`prefetch_fill`
// for one key, `prefetch_cached` for the other) produced as edges send them; the
// page's warm-ups table must show the warm-up sent and its region's counts.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PRODUCE_BIN, openBrowser, startPulse, until as poll } from './support.mjs';

const work = mkdtempSync(join(tmpdir(), 'pulse-warm-'));
let pulse;
let browser;
let page;
let id;

const until = (what, probe, ms) => poll(what, probe, { ms, context: () => pulse?.logTail() ?? '' });

/** Produces events for tenant `acme` in region `eu-west`: [key, outcome] pairs, now. */
function produce(name, events) {
  const file = join(work, `${name}.jsonl`);
  const now = Date.now();
  writeFileSync(file, events.map(([key, outcome], i) => JSON.stringify({
    v: 1, ts_ms: now + i, tenant: 'acme', key, region: 'eu-west', node: 'edge-1', outcome,
  })).join('\n') + '\n');
  execFileSync(PRODUCE_BIN, ['--brokers', pulse.broker, file]);
}

before(async () => {
  pulse = await startPulse(['--warm-rate', '50']);
  produce('users', [['/launch/a.js', 'miss'], ['/launch/b.css', 'miss'], ['/other', 'hit']]);
  await until('pulse to know the tenant', async () => {
    const r = await fetch(`${pulse.base}/api/heatmap?tenant=acme&window=60s`);
    return r.ok && (await r.json()).keys.length === 3;
  });
  const response = await fetch(`${pulse.base}/api/warm`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ tenant: 'acme', prefix: '/launch/', regions: ['eu-west'], pace: 50 }),
  });
  const body = await response.json();
  assert.equal(response.status, 202, JSON.stringify(body));
  id = body.id;
  // What the edges report once the commands reach them.
  produce('reports', [['/launch/a.js', 'prefetch_fill'], ['/launch/b.css', 'prefetch_cached']]);
  browser = await openBrowser(pulse.base);
  page = browser.page;
});

after(async () => {
  await browser?.context.close();
  await pulse?.stop();
});

test('the dashboard shows the warm-up sent and its region filled and cached', async () => {
  await page.goto(`${pulse.base}/?tenant=acme`);
  const row = `#warm-table tbody tr[data-id="${id}"]`;
  await until('the warm-up row to show both keys reported in eu-west', async () => {
    const region = await page.$(`${row} .warm-region[data-region="eu-west"]`);
    if (!region) return false;
    const phase = await page.$eval(row, (tr) => tr.dataset.phase);
    const filled = await region.getAttribute('data-filled');
    const cached = await region.getAttribute('data-cached');
    return phase === 'sent' && filled === '1' && cached === '1';
  }, 30_000);
  const cells = await page.$$eval(`${row} td`, (tds) => tds.map((td) => td.textContent));
  assert.equal(cells[1], 'acme');
  assert.equal(cells[3], '2 / 2');
  assert.match(cells[5], /1 filled \+ 1 cached of 2/);
  const bar = await page.$eval(`${row} progress`, (p) => [p.value, p.max]);
  assert.deepEqual(bar, [2, 2]);
});

test('the page threw nothing and loaded nothing from another host', () => {
  assert.deepEqual(browser.foreignRequests, []);
  assert.deepEqual(browser.pageErrors, []);
});
