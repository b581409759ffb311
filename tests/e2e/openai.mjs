// openai.mjs — the official `openai` npm client against a running strata-frontend: models, chat and
// completions, whole and streamed, stop strings, logprobs, usage, and the errors the client maps.
// Env: STRATA_PORT (frontend), STRATA_API_KEY, STRATA_NODE_MODULES (a folder holding node_modules/openai).
// Exits 0 when every check holds; prints each check as it passes.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.STRATA_NODE_MODULES ?? '.', 'noop.js'));
const OpenAI = require('openai');
const client = new OpenAI({
  baseURL: `http://127.0.0.1:${process.env.STRATA_PORT}/v1`,
  apiKey: process.env.STRATA_API_KEY ?? 'none',
  maxRetries: 0,
});
const ok = (what) => console.log(`ok - ${what}`);

const models = await client.models.list();
assert.equal(models.data.length, 1);
const model = models.data[0].id;
ok(`models.list: ${model}`);

// greedy, so the whole and the streamed answers must be the same text
const messages = [{ role: 'user', content: 'Tell me about the weather.' }];
const whole = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
const text = whole.choices[0].message.content;
assert.equal(typeof text, 'string');
assert.equal(whole.object, 'chat.completion');
assert.ok(['length', 'stop'].includes(whole.choices[0].finish_reason));
assert.ok(whole.usage.prompt_tokens > 0);
assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
ok(`chat, whole: ${whole.usage.completion_tokens} tokens`);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let streamed = '', finish = null, usage = null, chunks = 0;
for await (const c of stream) {
  chunks++;
  if (c.usage) usage = c.usage;
  if (!c.choices.length) continue;
  streamed += c.choices[0].delta.content ?? '';
  finish = c.choices[0].finish_reason ?? finish;
}
assert.equal(streamed, text);
assert.equal(finish, whole.choices[0].finish_reason);
assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
ok(`chat, streamed: ${chunks} chunks, same text`);

const prompt = 'The lighthouse keeper';
const comp = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
assert.equal(comp.object, 'text_completion');
const ctext = comp.choices[0].text;
let cstreamed = '';
for await (const c of await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true }))
  cstreamed += c.choices[0]?.text ?? '';
assert.equal(cstreamed, ctext);
ok(`completions, whole and streamed: ${JSON.stringify(ctext.slice(0, 30))}`);

// a stop string taken from the greedy text: the answer ends right before it
const ids = await fetch(`http://127.0.0.1:${process.env.STRATA_PORT}/tokenize`, {
  method: 'POST', headers: { Authorization: `Bearer ${process.env.STRATA_API_KEY}` },
  body: JSON.stringify({ content: prompt }),
}).then((r) => r.json());
assert.ok(ids.tokens.length > 0);
const byIds = await client.completions.create({ model, prompt: ids.tokens, max_tokens: 24, temperature: 0 });
assert.equal(byIds.choices[0].text, ctext);
ok('completions, prompt as token ids gives the same text');
const run = [...ctext.matchAll(/[\x21-\x7e]{3}/g)].find((m) => m.index > 0);
if (run) {
  const stop = run[0];
  const cut = ctext.slice(0, ctext.indexOf(stop));
  const s1 = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop: [stop] });
  assert.equal(s1.choices[0].text, cut);
  assert.equal(s1.choices[0].finish_reason, 'stop');
  let s2 = '';
  for await (const c of await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop, stream: true }))
    s2 += c.choices[0]?.text ?? '';
  assert.equal(s2, cut);
  ok(`stop ${JSON.stringify(stop)}: whole and streamed end before it`);
}

const lp = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3 });
assert.equal(lp.choices[0].logprobs.content.length, lp.usage.completion_tokens);
for (const e of lp.choices[0].logprobs.content) {
  assert.ok(e.logprob <= 0);
  assert.equal(e.top_logprobs.length, 3);
  assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
}
ok('logprobs with 3 alternatives');

// sampling with a seed repeats itself
const seeded = () => client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0.9, top_p: 0.95, top_k: 40, min_p: 0.05, seed: 1234 });
assert.equal((await seeded()).choices[0].message.content, (await seeded()).choices[0].message.content);
ok('seeded sampling is repeatable');

await assert.rejects(client.chat.completions.create({ model, messages, n: 17 }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'n');
await assert.rejects(client.chat.completions.create({ model, messages, temperature: 'hot' }),
  (e) => e.status === 400 && e.param === 'temperature');
const nokey = new OpenAI({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(nokey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
ok('errors: n=17 and a bad temperature are 400, a wrong key is 401');
console.log('all openai client checks passed');
