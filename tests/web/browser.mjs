// browser.mjs — strata's web pages in a real browser (Debian's chromium, driven by playwright-core
// over the DevTools protocol) against a running `strata serve` with an API key:
//   - chat: the key is asked once, the model's name shows, a message is answered as a stream, a
//     long answer is stopped mid-stream (and ends on the worker), the markdown renderer turns
//     markup in model text into text, an oversized paste shows the API's 413 message;
//   - monitor: the plots receive samples, the heat map's counts grow after requests;
//   - the frontend killed -9 while both pages are open (serve restarts it): the stream that was
//     running says the connection was lost, the pages say they reconnected, and chat works again;
//   - with STRATA_SOAK_S, a soak: the monitor open and a request every 2 s for that long, the
//     frontend's and the worker's RSS and the page's JS heap must not grow.
// Screenshots go to $STRATA_SHOTS (chat.png, monitor.png). Env: STRATA_URL (http://127.0.0.1:P),
// STRATA_API_KEY, STRATA_NODE_MODULES (holding node_modules/playwright-core), STRATA_CHROMIUM,
// STRATA_STATE (serve.json: the children's pids), STRATA_TEST_SLOWDOWN (tests/testutil.h: how much
// slower than an idle machine this run may be; every wait's limit below is stretched by it, as
// they only bound how long an event may take to come, on a 2-core CI machine with other load).
// Prints "ok - ..." per check; exits 1 on a failure.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.resolve(process.env.STRATA_NODE_MODULES ?? '.', 'noop.js'));
const { chromium } = require('playwright-core');
const base = process.env.STRATA_URL, key = process.env.STRATA_API_KEY;
const shots = process.env.STRATA_SHOTS ?? '.';
const soakS = Number(process.env.STRATA_SOAK_S ?? 0);
const ok = (what) => console.log(`ok - ${what}`);
const slowdown = Math.max(1, Number(process.env.STRATA_TEST_SLOWDOWN ?? 1) || 1);
// limit: a wait's limit of ms on an idle machine, stretched by the slowdown
const limit = (ms) => ms * slowdown;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const state = () => JSON.parse(fs.readFileSync(process.env.STRATA_STATE, 'utf8'));
// stepped makes the demo model's answer, which comes in tens of milliseconds, watchable: the worker
// is stopped (SIGSTOP) before ask() sends the question, then runs in short steps (SIGCONT, 2 ms,
// SIGSTOP), and after each one, while it is stopped, the page gets time to show what came (50 ms)
// and look (run in the page) says whether to stop there. It returns what look returned (an object
// with stop: true) with the worker left stopped: an answer look saw running is still running until
// SIGCONT. The page is looked at while nothing can change: under load the browser can take far
// longer than any fixed slice of the worker's time to show a token, and a worker let run while the
// question is sent answers a short turn whole (the test failed both ways when it sent SIGSTOP 40
// ms / SIGCONT 4 ms from after the question on and hoped the page kept up).
async function stepped(pid, page, ask, look) {
  process.kill(pid, 'SIGSTOP');
  await ask();
  for (const end = Date.now() + limit(60000); Date.now() < end;) {
    process.kill(pid, 'SIGCONT');
    await sleep(2);
    process.kill(pid, 'SIGSTOP');
    await sleep(50);
    const r = await page.evaluate(look);
    if (r.stop) return r;
  }
  return { stop: true, state: 'timeout', len: 0 };
}

// lookLast (run in the page): the last answer's state and the length of its text.
const lookLast = () => {
  const b = [...document.querySelectorAll('.msg.assistant, .msg.error')].pop();
  return { state: b.dataset.state, len: b.querySelector('.body').textContent.length };
};

const auth = { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' };

async function status() {
  const r = await fetch(`${base}/status`, { headers: auth });
  assert.equal(r.status, 200);
  return r.json();
}

async function chatCall(maxTokens) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: auth,
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Speak of the king.' }], max_tokens: maxTokens }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return JSON.parse(text);
}

const browser = await chromium.launch({
  executablePath: process.env.STRATA_CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
});
const errors = [];
let exitCode = 0;
try {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 820 } });
  const watch = (page, name) => {
    page.on('pageerror', (e) => errors.push(`${name}: ${e.message}`));
    page.on('console', (m) => {
      // a request the test made fail on purpose is logged by the browser as an error: only
      // script errors and CSP violations count
      if (m.type() === 'error' && !/Failed to load resource|net::ERR_/.test(m.text())) errors.push(`${name}: ${m.text()}`);
    });
  };
  const chat = await ctx.newPage();
  watch(chat, 'chat');
  await chat.goto(`${base}/`);

  // the key, asked once
  await chat.waitForSelector('#keybox[open]', { timeout: limit(10000) });
  await chat.fill('#keybox input', key);
  await chat.click('#keybox button');
  await chat.waitForFunction(() => document.body.dataset.model, null, { timeout: limit(10000) });
  const model = await chat.textContent('#model');
  ok(`chat: the key was asked once, model "${model}"`);

  // a streamed answer: part of it is on screen while the rest is still coming (the worker
  // stepped), then the whole of it. An answer that ended before any part of it was seen is asked
  // again.
  await chat.fill('#max_tokens', '200');
  await chat.fill('#temperature', '0.8');
  const wpid0 = state().workers[0].pid;
  let partial = null, whole = null;
  for (let attempt = 0; attempt < 5 && !whole; attempt++) {
    const ask = async () => {
      await chat.fill('#input', `To be, or not to be? ${attempt}`);
      await chat.press('#input', 'Enter');
    };
    partial = await stepped(wpid0, chat, ask, () => {
      const b = [...document.querySelectorAll('.msg.assistant, .msg.error')].pop();
      if (!b) return { stop: false };
      const len = b.querySelector('.body').textContent.length;
      return { stop: b.dataset.state !== 'streaming' || len > 0, state: b.dataset.state, len };
    });
    process.kill(wpid0, 'SIGCONT');
    await chat.waitForFunction(() => [...document.querySelectorAll('.msg.assistant, .msg.error')].pop().dataset.state !== 'streaming', null, { timeout: limit(60000) });
    const end = await chat.evaluate(lookLast);
    if (partial.state === 'streaming' && end.state === 'done' && end.len > partial.len) whole = end;
  }
  assert.ok(whole, `no answer was seen streaming: last look ${JSON.stringify(partial)}`);
  const answer = await chat.textContent('.msg.assistant:last-of-type .body');
  assert.ok(answer.trim().length > 0);
  ok(`chat: streamed answer: ${partial.len} chars on screen mid-stream, then all ${whole.len}`);
  assert.match(await chat.textContent('#ctxtext'), /^\d+ \/ \d+ tokens$/);
  ok(`chat: context use "${await chat.textContent('#ctxtext')}"`);

  // stop mid-stream: the text stops growing and the worker ends the request. The worker is stepped
  // until 30 characters are in, then left stopped while the page clicks Stop, so the answer cannot
  // end first; an answer shorter than that is retried.
  await chat.fill('#max_tokens', '1500');
  let stopped = null;
  for (let attempt = 0; attempt < 5 && stopped !== 'stopped'; attempt++) {
    const ask = async () => {
      await chat.fill('#input', `Now tell me a long story of kings, ${attempt}.`);
      await chat.press('#input', 'Enter');
    };
    const wpid = state().workers[0].pid;
    stopped = (await stepped(wpid, chat, ask, () => {
      const b = [...document.querySelectorAll('.msg.assistant')].pop();
      if (b && b.dataset.state !== 'streaming') return { stop: true, state: b.dataset.state }; // too short: again
      return { stop: !!b && b.querySelector('.body').textContent.length > 30, state: 'go' };
    })).state;
    if (stopped === 'go') {
      stopped = await chat.evaluate(async (ms) => {
        document.getElementById('stop').click();
        for (const t0 = performance.now(); performance.now() - t0 < ms;) {
          const b = [...document.querySelectorAll('.msg.assistant, .msg.error')].pop();
          if (b.dataset.state !== 'streaming') return b.dataset.state;
          await new Promise((r) => setTimeout(r, 10));
        }
        return 'timeout';
      }, limit(60000));
    }
    process.kill(wpid, 'SIGCONT');
  }
  assert.equal(stopped, 'stopped');
  const len1 = (await chat.textContent('.msg.assistant:last-of-type .body')).length;
  let running = -1;
  for (const end = Date.now() + limit(10000); running !== 0 && Date.now() < end;) {
    await sleep(200);
    running = (await status()).workers.reduce((a, w) => a + w.running + w.queued, 0);
  }
  assert.equal(running, 0, 'the stopped request still runs on the worker');
  assert.equal((await chat.textContent('.msg.assistant:last-of-type .body')).length, len1);
  ok(`chat: stopped mid-stream after ${len1} chars; the worker runs nothing`);
  await chat.screenshot({ path: path.join(shots, 'chat.png') });

  // markup in model text stays text (the renderer is the page's own, in this browser)
  const md = await chat.evaluate(() => {
    const d = document.createElement('div');
    Strata.markdown(d, 'Hi <img src=x onerror="window.pwned=1"> **bold** and `<b>code</b>`\n\n' +
      '```html\n<script>window.pwned=2</script>\n```\n- [a link](javascript:window.pwned=3)\n- [ok](https://example.org/)');
    return { bad: d.querySelectorAll('img, script, b, [onerror]').length, strong: d.querySelectorAll('strong').length,
      pre: d.querySelector('pre code')?.textContent, links: [...d.querySelectorAll('a')].map((a) => a.href),
      text: d.textContent, pwned: window.pwned ?? null };
  });
  assert.equal(md.bad, 0);
  assert.equal(md.pwned, null);
  assert.equal(md.strong, 1);
  assert.equal(md.pre, '<script>window.pwned=2</script>');
  assert.deepEqual(md.links, ['https://example.org/']);
  assert.ok(md.text.includes('<img src=x onerror="window.pwned=1">'));
  ok('chat: markdown renders, markup from the model stays text, javascript: links are not links');

  // an oversized paste: the API's 413 and its message are shown
  await chat.fill('#input', 'x'.repeat(200 * 1024));
  await chat.press('#input', 'Enter');
  await chat.waitForSelector('.msg.error', { timeout: limit(15000) });
  const err = await chat.textContent('.msg.error:last-of-type .body');
  assert.match(err, /413/);
  assert.match(err, /larger than the server's limit/);
  ok(`chat: oversized paste: "${err.slice(0, 90)}…"`);
  await chat.screenshot({ path: path.join(shots, 'chat-error.png') });

  // the monitor: samples arrive, the heat map grows after requests
  const mon = await ctx.newPage();
  watch(mon, 'monitor');
  await mon.goto(`${base}/monitor`);
  await mon.waitForFunction(() => Number(document.body.dataset.samples || 0) >= 3, null, { timeout: limit(15000) });
  const points = await mon.getAttribute('#p-tok', 'data-points');
  assert.ok(Number(points) >= 3);
  const t0 = Number(await mon.getAttribute('#heat', 'data-total'));
  for (let i = 0; i < 3; i++) await chatCall(40);
  await mon.waitForFunction((t) => Number(document.getElementById('heat').dataset.total) > t &&
    Number(document.getElementById('heat').dataset.recent) > 0, t0, { timeout: limit(10000) });
  const t1 = Number(await mon.getAttribute('#heat', 'data-total'));
  const workers = await mon.locator('.card[data-worker]').count();
  assert.ok(workers >= 1);
  await sleep(2500); // a few more samples: the plots show the requests
  ok(`monitor: ${points}+ samples plotted, heat map total ${t0} -> ${t1} tokens, ${workers} worker card(s)`);
  await mon.screenshot({ path: path.join(shots, 'monitor.png'), fullPage: true });

  // the frontend killed mid-stream while both pages are open; serve restarts it (the chat in
  // front: a tab behind draws no frames, so its text would not grow on screen)
  await chat.bringToFront();
  const history = async (page) => page.evaluate(() => {
    window.connHistory = [];
    new MutationObserver(() => window.connHistory.push(document.body.dataset.conn))
      .observe(document.body, { attributes: true, attributeFilter: ['data-conn'] });
  });
  await history(chat);
  await history(mon);
  // the worker is stepped, and left stopped once the answer is under way, so the stream is surely
  // still open when the frontend dies; it goes on (SIGCONT) once the page said the connection is
  // lost
  const fpid = state().frontends[0].pid, wpid = state().workers[0].pid;
  await chat.fill('#max_tokens', '1500');
  let going = null;
  for (let attempt = 0; attempt < 5 && going !== 'go'; attempt++) {
    const ask = async () => {
      await chat.fill('#input', `Tell me again of the long story of kings, ${attempt}.`);
      await chat.press('#input', 'Enter');
    };
    going = (await stepped(wpid, chat, ask, () => {
      const b = [...document.querySelectorAll('.msg.assistant, .msg.error')].pop();
      if (!b) return { stop: false };
      if (b.dataset.state !== 'streaming') return { stop: true, state: b.dataset.state };
      return { stop: b.querySelector('.body').textContent.length > 10, state: 'go' };
    })).state;
    // what was already on its way to the page (the answer's end, say) still arrives
    if (going === 'go') going = await chat.evaluate(() => [...document.querySelectorAll('.msg.assistant, .msg.error')].pop().dataset.state === 'streaming' ? 'go' : 'ended');
    if (going !== 'go') process.kill(wpid, 'SIGCONT');
  }
  assert.equal(going, 'go');
  process.kill(fpid, 'SIGKILL');
  await chat.waitForFunction(() => window.connHistory.includes('down'), null, { timeout: limit(10000) });
  process.kill(wpid, 'SIGCONT');
  const lost = await chat.textContent('.msg.error:last-of-type .body');
  assert.match(lost, /connection/i);
  ok(`restart: the stream says "${lost}", the banner said "Connection to the server lost"`);
  await chat.waitForFunction(() => window.connHistory.includes('back'), null, { timeout: limit(40000) });
  const npid = state().frontends[0].pid;
  assert.notEqual(npid, fpid);
  const samples0 = Number(await mon.evaluate(() => document.body.dataset.samples));
  await mon.waitForFunction((n) => Number(document.body.dataset.samples) > n + 1, samples0, { timeout: limit(15000) });
  const hm = await mon.evaluate(() => window.connHistory);
  if (hm.includes('down')) assert.ok(hm.includes('back'), `monitor: ${hm}`);
  ok(`restart: frontend ${fpid} -> ${npid}; chat said "Reconnected to the server."; ` +
    `monitor ${hm.includes('down') ? 'lost and regained it' : 'polled across it'} and goes on`);
  await chat.fill('#max_tokens', '16');
  await chat.fill('#input', 'Are you back?');
  await chat.press('#input', 'Enter');
  await chat.waitForFunction(() => [...document.querySelectorAll('.msg.assistant')].pop().dataset.state === 'done', null, { timeout: limit(60000) });
  ok('restart: chat answers again');

  if (soakS > 0) {
    const rss = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
    const pids = () => ({ fe: state().frontends[0].pid, wk: state().workers[0].pid });
    const heap = async () => (await (await mon.context().newCDPSession(mon)).send('Runtime.getHeapUsage')).usedSize;
    const sample = async () => { const p = pids(); return { fe: rss(p.fe), wk: rss(p.wk), heap: await heap(), p }; };
    const warm = Math.min(60, soakS / 5);
    const tEnd = Date.now() + soakS * 1000;
    let first = null, n = 0;
    while (Date.now() < tEnd) {
      await chatCall(16);
      n++;
      await sleep(2000);
      if (!first && Date.now() > tEnd - (soakS - warm) * 1000) first = await sample();
    }
    await mon.evaluate(() => new Promise((r) => setTimeout(r, 1500)));
    const last = await sample();
    const mib = (b) => (b / 1048576).toFixed(1);
    console.log(`soak: ${soakS} s, ${n} requests; frontend RSS ${mib(first.fe)} -> ${mib(last.fe)} MiB, ` +
      `worker RSS ${mib(first.wk)} -> ${mib(last.wk)} MiB, page JS heap ${mib(first.heap)} -> ${mib(last.heap)} MiB`);
    assert.deepEqual(last.p, first.p, 'a process was restarted during the soak');
    assert.ok(last.fe - first.fe < 8 << 20, 'the frontend grew');
    assert.ok(last.wk - first.wk < 8 << 20, 'the worker grew');
    assert.ok(last.heap - first.heap < 4 << 20, 'the page grew');
    ok('soak: no growth');
  }
  assert.deepEqual(errors, [], 'errors in the pages');
  ok('no script error or CSP violation in the pages');
} catch (e) {
  console.error(`FAILED: ${e.stack ?? e}`);
  if (errors.length) console.error(`page errors: ${errors.join('\n')}`);
  exitCode = 1;
} finally {
  await browser.close();
}
process.exit(exitCode);
