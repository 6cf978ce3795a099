// The dashboard against a pulse that requires an API token (`--api-token`): the
// page asks for the token on a 401, refuses a wrong one, and works with the right
// one, typed in or passed once as /#token=… (which then leaves the address bar).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { openBrowser, startPulse, until as poll } from './support.mjs';

const TOKEN = 'dashboard-t0ken';
let pulse;
let browser;
let page;

const until = (what, probe) => poll(what, probe, { ms: 20_000, context: () => pulse?.logTail() ?? '' });
const status = () => page.textContent('#status');
const formShown = () => page.isVisible('#token-form');

before(async () => {
  pulse = await startPulse(['--api-token', TOKEN]);
  browser = await openBrowser(pulse.base);
  page = browser.page;
});

after(async () => {
  await browser?.context.close();
  await pulse?.stop();
});

test('without a token the API answers 401 and the page asks for one', async () => {
  const response = await fetch(`${pulse.base}/api/tenants`);
  assert.equal(response.status, 401);
  assert.equal(response.headers.get('www-authenticate'), 'Bearer');

  await page.goto(`${pulse.base}/`);
  await until('the page to ask for a token', async () =>
    (await formShown()) && /needs an API token/.test(await status()));
  assert.equal(await page.locator('#heatmap tbody tr').count(), 0);
});

test('a wrong token is refused and the form stays', async () => {
  await page.fill('#token', 'not-the-token');
  await page.click('#token-form button[type=submit]');
  await until('the page to say the token was refused', async () =>
    /token was refused/.test(await status()));
  assert.ok(await formShown());
});

test('the right token opens the dashboard and lasts for the tab', async () => {
  await page.fill('#token', TOKEN);
  await page.click('#token-form button[type=submit]');
  await until('the dashboard to reach the API', async () =>
    /Waiting for events/.test(await status()));
  assert.equal(await formShown(), false);
  assert.equal(await page.$eval('#token', (i) => i.value), '', 'the field is cleared');

  await page.reload();
  await until('the reloaded page to reach the API', async () =>
    /Waiting for events/.test(await status()));
  assert.equal(await formShown(), false);
});

test('a token passed as /#token=… is used and leaves the address bar', async () => {
  const fresh = await browser.context.newPage();
  try {
    await fresh.goto(`${pulse.base}/?window=1s#token=${TOKEN}`);
    await poll('the page opened with #token to reach the API', async () =>
      /Waiting for events/.test(await fresh.textContent('#status')), { ms: 20_000 });
    assert.equal(new URL(fresh.url()).hash, '');
    assert.doesNotMatch(fresh.url(), new RegExp(TOKEN));
    assert.equal(await fresh.isVisible('#token-form'), false);
  } finally {
    await fresh.close();
  }
});

test('the page threw nothing and loaded nothing from another host', () => {
  assert.deepEqual(browser.foreignRequests, []);
  // The 401s themselves show up as failed loads; anything else is a fault.
  const errors = browser.pageErrors.filter((e) => !/status of 401/.test(e));
  assert.deepEqual(errors, []);
});
