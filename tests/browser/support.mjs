// What the browser tests share: polling with a deadline, a pulse process on its
// embedded broker, and Debian's Chromium driven by playwright-core.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

export const PULSE_BIN = process.env.PULSE_BIN;
export const PRODUCE_BIN = process.env.PRODUCE_BIN;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const WAIT_MS = 60_000;

assert.ok(PULSE_BIN, 'PULSE_BIN must name the pulse binary (scripts/test-browser sets it)');
assert.ok(PRODUCE_BIN, 'PRODUCE_BIN must name the produce example (scripts/test-browser sets it)');

/**
 * Polls `probe` until it returns a truthy value, or fails after `ms` naming `what`
 * and showing `context()` (a log tail, say).
 */
export async function until(what, probe, { ms = WAIT_MS, context = () => '' } = {}) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await probe();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      assert.fail(`timed out after ${ms} ms waiting for ${what} (last: ${last})\n${context()}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Starts `pulse serve` on a free port with its embedded broker and waits for it to
 * print both addresses. `log()` is everything it printed so far.
 */
export async function startPulse(extraArgs = []) {
  const child = spawn(PULSE_BIN, ['serve', '--listen', '127.0.0.1:0', ...extraArgs], {
    env: { ...process.env, RUST_LOG: 'warn', NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => { output += d; });
  child.stderr.on('data', (d) => { output += d; });
  const pulse = {
    log: () => output,
    logTail: () => `pulse log tail:\n${output.slice(-2000)}`,
    base: undefined,
    broker: undefined,
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      await new Promise((resolve) => {
        const t = setTimeout(() => { child.kill('SIGKILL'); resolve(); }, 10_000);
        child.on('exit', () => { clearTimeout(t); resolve(); });
      });
    },
  };
  await until('pulse to print its addresses', async () => {
    if (child.exitCode !== null) assert.fail(`pulse exited ${child.exitCode}:\n${output}`);
    pulse.broker = output.match(/^embedded broker: (\S+)$/m)?.[1];
    pulse.base = output.match(/^dashboard: (http:\/\/127\.0\.0\.1:\d+)\//m)?.[1];
    return pulse.broker && pulse.base;
  }, { ms: 30_000, context: pulse.logTail });
  return pulse;
}

/**
 * Headless Chromium with a fresh profile, and its first page; the page's errors and
 * any request leaving `base` are collected for the tests to check.
 */
export async function openBrowser(base) {
  const profile = mkdtempSync(join(tmpdir(), 'pulse-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run',
    ],
    viewport: { width: 1400, height: 1000 },
  });
  const page = context.pages()[0] || (await context.newPage());
  const pageErrors = [];
  const foreignRequests = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') pageErrors.push(m.text()); });
  page.on('request', (r) => {
    const url = r.url();
    if (!url.startsWith(base) && !url.startsWith('data:')) foreignRequests.push(url);
  });
  return { context, page, pageErrors, foreignRequests };
}
