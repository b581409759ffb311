// loadtest.mjs — N concurrent streaming clients against a strata-frontend for M seconds.
// Prints one table row: requests, errors (must be 0), generated tok/s, requests/s, time to first
// token and time per output token (p50/p99, per request), and exits 1 if any request failed.
//   node tests/e2e/loadtest.mjs --port 8080 [--key K] [--clients 4] [--seconds 10]
//        [--max-tokens 64] [--kind chat|completion] [--prompt TEXT] [--header]
import { parseArgs } from 'node:util';

const { values: o } = parseArgs({
  options: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '8080' },
    key: { type: 'string', default: process.env.STRATA_API_KEY ?? '' },
    clients: { type: 'string', default: '4' },
    seconds: { type: 'string', default: '10' },
    'max-tokens': { type: 'string', default: '64' },
    kind: { type: 'string', default: 'chat' },
    prompt: { type: 'string', default: 'Write a short story about a lighthouse keeper.' },
    header: { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
  },
});
const clients = +o.clients, seconds = +o.seconds, maxTokens = +o['max-tokens'];
const url = `http://${o.host}:${o.port}/v1/${o.kind === 'chat' ? 'chat/completions' : 'completions'}`;
const headers = { 'Content-Type': 'application/json' };
if (o.key) headers.Authorization = `Bearer ${o.key}`;

const ttft = [], tpot = [], errors = [];
let tokens = 0, requests = 0, seq = 0;

// one streamed request: times the first token and the gaps after it from the SSE chunks
async function one() {
  // logprobs make every token visible as it comes, even one whose text is empty (a random model's
  // padding tokens) or held back (an incomplete UTF-8 character), so the timings are per token
  const body = { max_tokens: maxTokens, temperature: 0.8, seed: seq++, stream: true, stream_options: { include_usage: true } };
  if (o.kind === 'chat') Object.assign(body, { messages: [{ role: 'user', content: o.prompt }], logprobs: true });
  else Object.assign(body, { prompt: o.prompt, logprobs: 0 });
  const t0 = performance.now();
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${(await res.text()).slice(0, 200)}`);
  let first = 0, last = 0, n = 0, buf = '', done = false;
  const dec = new TextDecoder();
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, at);
      buf = buf.slice(at + 2);
      if (!ev.startsWith('data: ')) continue;
      if (ev === 'data: [DONE]') { done = true; continue; }
      const c = JSON.parse(ev.slice(6));
      if (c.error) throw new Error(`stream error: ${c.error.message}`);
      if (c.usage) n = c.usage.completion_tokens;
      const ch = c.choices?.[0];
      const text = ch ? (ch.delta ? (ch.delta.content ?? '') + (ch.delta.reasoning_content ?? '') : ch.text) : '';
      if (text || ch?.logprobs) {
        // (the first chat chunk carries only the role: it has neither)
        const t = performance.now();
        if (!first) first = t;
        last = t;
      }
    }
  }
  if (!done) throw new Error('stream ended without [DONE]');
  requests++;
  tokens += n;
  if (first) ttft.push(first - t0);
  if (n > 1 && last > first) tpot.push((last - first) / (n - 1));
}

const end = performance.now() + seconds * 1000;
const start = performance.now();
await Promise.all(Array.from({ length: clients }, async () => {
  while (performance.now() < end) {
    try {
      await one();
    } catch (e) {
      errors.push(e.message);
      await new Promise((r) => setTimeout(r, 100)); /* a refused connection would spin */
    }
  }
}));
const wall = (performance.now() - start) / 1000;
const pct = (a, p) => {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const row = {
  clients, seconds: +wall.toFixed(1), requests, errors: errors.length,
  'tok/s': +(tokens / wall).toFixed(1), 'req/s': +(requests / wall).toFixed(2),
  'ttft p50 ms': +pct(ttft, 50).toFixed(1), 'ttft p99 ms': +pct(ttft, 99).toFixed(1),
  'tpot p50 ms': +pct(tpot, 50).toFixed(2), 'tpot p99 ms': +pct(tpot, 99).toFixed(2),
};
if (o.json) {
  console.log(JSON.stringify(row));
} else {
  const cols = Object.keys(row);
  const w = cols.map((c) => Math.max(c.length, String(row[c]).length));
  if (o.header) console.log(cols.map((c, i) => c.padStart(w[i])).join('  '));
  console.log(cols.map((c, i) => String(row[c]).padStart(w[i])).join('  '));
}
for (const e of errors.slice(0, 5)) console.error(`error: ${e}`);
process.exit(errors.length ? 1 : 0);
