// responses.mjs — the official `openai` npm client's Responses API against a running strata
// serve: text whole and streamed (the raw events and the SDK's stream helper), instructions,
// input items with function calls and their outputs, function tools, cached prompt tokens, chat
// completions with n > 1, and the refusals of a stateless server.
// Env: STRATA_PORT, STRATA_API_KEY, STRATA_NODE_MODULES (a folder holding node_modules/).
// Exits 0 when every check holds; prints each check as it passes.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.STRATA_NODE_MODULES ?? '.', 'noop.js'));
const mod = require('openai');
const OpenAI = mod.OpenAI ?? mod.default ?? mod;
const client = new OpenAI({
  baseURL: `http://127.0.0.1:${process.env.STRATA_PORT}/v1`,
  apiKey: process.env.STRATA_API_KEY ?? 'none',
  maxRetries: 0,
});
const ok = (what) => console.log(`ok - ${what}`);

const model = (await client.models.list()).data[0].id;
const one = await client.models.retrieve(model);
assert.equal(one.id, model);
assert.ok(one.max_model_len > 0);
const input = 'Tell me about the weather.';
const whole = await client.responses.create({ model, input, max_output_tokens: 16, temperature: 0 });
assert.equal(whole.object, 'response');
assert.ok(whole.id.startsWith('resp_'));
assert.ok(['completed', 'incomplete'].includes(whole.status));
assert.equal(typeof whole.output_text, 'string');
assert.ok(whole.usage.input_tokens > 0 && whole.usage.output_tokens > 0);
assert.equal(whole.usage.total_tokens, whole.usage.input_tokens + whole.usage.output_tokens);
ok(`responses.create: ${whole.usage.output_tokens} tokens, ${whole.status}`);

let streamed = '', last = null, seq = -1;
const seen = new Set();
for await (const ev of await client.responses.create({ model, input, max_output_tokens: 16, temperature: 0, stream: true })) {
  assert.ok(ev.sequence_number > seq);
  seq = ev.sequence_number;
  seen.add(ev.type);
  if (ev.type === 'response.output_text.delta') streamed += ev.delta;
  last = ev;
}
assert.equal(streamed, whole.output_text);
assert.ok(seen.has('response.created') && seen.has('response.output_item.added') && seen.has('response.output_text.done'));
assert.ok(['response.completed', 'response.incomplete'].includes(last.type));
assert.equal(last.response.status, whole.status);
assert.equal(last.response.usage.output_tokens, whole.usage.output_tokens);
ok(`responses stream: ${seq + 1} events, the same text`);

const helper = client.responses.stream({ model, input, max_output_tokens: 16, temperature: 0 });
let helperText = '';
helper.on('response.output_text.delta', (ev) => { helperText += ev.delta; });
const final = await helper.finalResponse();
const outText = (resp) => resp.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');
assert.equal(helperText, whole.output_text);
assert.equal(outText(final), whole.output_text);
ok('responses.stream helper: the accumulated response has the same text');

// instructions, items, function tools: accepted, and the history reaches the prompt
const tools = [{ type: 'function', name: 'get_weather', description: 'The weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const items = [
  { role: 'user', content: [{ type: 'input_text', text: 'What is the weather in Paris?' }] },
  { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
  { type: 'function_call_output', call_id: 'call_1', output: '18 degrees, sunny' },
];
const r = await client.responses.create({ model, instructions: 'You are terse.', input: items, tools, tool_choice: 'auto', max_output_tokens: 8, temperature: 0 });
assert.ok(['completed', 'incomplete'].includes(r.status));
assert.equal(r.instructions, 'You are terse.');
assert.equal(r.tools.length, 1);
for (const o of r.output) assert.ok(['message', 'reasoning', 'function_call'].includes(o.type));
const plain = await client.responses.create({ model, input: 'What is the weather in Paris?', max_output_tokens: 1 });
assert.ok(r.usage.input_tokens > plain.usage.input_tokens + 10, `${r.usage.input_tokens} vs ${plain.usage.input_tokens}`);
ok(`function tools and call items: prompt ${plain.usage.input_tokens} -> ${r.usage.input_tokens} tokens`);

// a forced call (one): when the chat layer forces tool calls (its grammar), the response's output
// is a function_call item, whole and streamed, the chat API's call of the same prompt (greedy)
const pingParams = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
const ask = 'What is the weather in Paris?';
const forcedChat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: ask }], max_tokens: 100,
  temperature: 0, tool_choice: 'required', parallel_tool_calls: false,
  tools: [{ type: 'function', function: { name: 'ping', parameters: pingParams } }] });
const chatCall = forcedChat.choices[0].message.tool_calls?.[0];
if (chatCall) {
  const ptools = [{ type: 'function', name: 'ping', parameters: pingParams }];
  const forced = await client.responses.create({ model, input: ask, tools: ptools, tool_choice: 'required',
    parallel_tool_calls: false, max_output_tokens: 100, temperature: 0 });
  const calls = forced.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'ping');
  assert.deepEqual(JSON.parse(calls[0].arguments), JSON.parse(chatCall.function.arguments));
  let args = '', doneItem = null;
  for await (const ev of await client.responses.create({ model, input: ask, tools: ptools, stream: true, max_output_tokens: 100,
    temperature: 0, parallel_tool_calls: false, tool_choice: { type: 'function', name: 'ping' } })) {
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.output_item.done' && ev.item.type === 'function_call') doneItem = ev.item;
  }
  assert.equal(args, doneItem.arguments);
  assert.deepEqual(JSON.parse(args), JSON.parse(calls[0].arguments));
  ok(`forced tool call: function_call ping ${calls[0].arguments}, whole and streamed`);
} else {
  ok('forced tool call: skipped (the chat layer makes no tool calls)');
}

// the same long prompt twice: cached tokens from the worker's prefix cache
const longInput = 'Describe, at length, the weather of every season in a coastal town. '.repeat(4);
await client.responses.create({ model, input: longInput, max_output_tokens: 2 });
const again = await client.responses.create({ model, input: longInput, max_output_tokens: 2 });
assert.ok(again.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(again.usage));
const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: longInput }], max_tokens: 2 });
assert.ok(chat.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(chat.usage));
ok(`cached tokens: responses ${again.usage.input_tokens_details.cached_tokens}, chat ${chat.usage.prompt_tokens_details.cached_tokens}`);

// n > 1: the later choices share the prompt's KV through the worker's prefix cache
const nPrompt = [{ role: 'user', content: 'Another long prompt about the tides, the winds and the rain of the coast. '.repeat(3) }];
const multi = await client.chat.completions.create({ model, messages: nPrompt, n: 3, max_tokens: 4 });
assert.equal(multi.choices.length, 3);
assert.deepEqual(multi.choices.map((c) => c.index), [0, 1, 2]);
assert.equal(multi.usage.completion_tokens, multi.choices.reduce((k, c) => k + c.timings.predicted_n, 0));
assert.ok(multi.choices[1].timings.cache_n > 0 && multi.choices[2].timings.cache_n > 0,
  JSON.stringify(multi.choices.map((c) => c.timings)));
let nStreamed = 0;
const idx = new Set();
for await (const c of await client.chat.completions.create({ model, messages: nPrompt, n: 2, max_tokens: 4, stream: true })) {
  for (const ch of c.choices) idx.add(ch.index);
  nStreamed++;
}
assert.deepEqual([...idx].sort(), [0, 1]);
ok(`n = 3: cache_n ${multi.choices.map((c) => c.timings.cache_n).join(', ')}; streamed n = 2 in ${nStreamed} chunks`);

await assert.rejects(client.responses.create({ model, input, previous_response_id: 'resp_123' }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
await assert.rejects(client.responses.create({ model, input, tools: [{ type: 'web_search' }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools');
ok('stateless: previous_response_id and built-in tools refused with 400');
