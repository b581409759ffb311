// anthropic.mjs — the official `@anthropic-ai/sdk` npm client against a running strata serve:
// models, messages whole and streamed (the SDK's stream helper and the raw events), system
// prompts, stop sequences, thinking, tools with a tool_use / tool_result history, count_tokens,
// cached prompt tokens, and the errors the client maps.
// Env: STRATA_PORT, STRATA_API_KEY, STRATA_NODE_MODULES (a folder holding node_modules/).
// Exits 0 when every check holds; prints each check as it passes.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.STRATA_NODE_MODULES ?? '.', 'noop.js'));
const sdk = require('@anthropic-ai/sdk');
const Anthropic = sdk.Anthropic ?? sdk.default ?? sdk;
const baseURL = `http://127.0.0.1:${process.env.STRATA_PORT}`;
const client = new Anthropic({ baseURL, apiKey: process.env.STRATA_API_KEY ?? 'none', maxRetries: 0 });
const ok = (what) => console.log(`ok - ${what}`);
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

const models = await client.models.list();
assert.equal(models.data.length, 1);
assert.equal(models.data[0].type, 'model');
const model = models.data[0].id;
assert.equal((await client.models.retrieve(model)).id, model);
ok(`models.list and retrieve: ${model}`);

// greedy: the whole and the streamed answers are the same text
const messages = [{ role: 'user', content: 'Tell me about the weather.' }];
const whole = await client.messages.create({ model, max_tokens: 16, temperature: 0, messages });
assert.equal(whole.type, 'message');
assert.equal(whole.role, 'assistant');
assert.ok(whole.id.startsWith('msg_'));
assert.ok(['end_turn', 'max_tokens'].includes(whole.stop_reason));
assert.ok(whole.usage.input_tokens > 0);
assert.ok(whole.usage.output_tokens > 0 && whole.usage.output_tokens <= 16);
const text = textOf(whole);
ok(`messages.create: ${whole.usage.output_tokens} tokens, ${whole.stop_reason}`);

const stream = client.messages.stream({ model, max_tokens: 16, temperature: 0, messages });
let deltas = '';
stream.on('text', (t) => { deltas += t; });
const final = await stream.finalMessage();
assert.equal(textOf(final), text);
assert.equal(deltas, text);
assert.equal(final.stop_reason, whole.stop_reason);
assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
ok('messages.stream: the same text, stop reason and usage');

const types = [];
for await (const ev of await client.messages.create({ model, max_tokens: 8, temperature: 0, messages, stream: true }))
  types.push(ev.type);
assert.equal(types[0], 'message_start');
assert.equal(types.at(-1), 'message_stop');
assert.equal(types.at(-2), 'message_delta');
assert.ok(types.includes('content_block_start') && types.includes('content_block_stop'));
ok(`raw stream events: ${[...new Set(types)].join(', ')}`);

// a stop sequence taken from the greedy text: the answer ends right before it, and says which
const run = [...text.matchAll(/[\x21-\x7e]{3}/g)].find((m) => m.index > 0);
if (run) {
  const s = await client.messages.create({ model, max_tokens: 16, temperature: 0, messages, stop_sequences: [run[0]] });
  assert.equal(s.stop_reason, 'stop_sequence');
  assert.equal(s.stop_sequence, run[0]);
  assert.equal(textOf(s), text.slice(0, text.indexOf(run[0])));
  ok(`stop_sequences ${JSON.stringify(run[0])}: stop_reason stop_sequence`);
} else {
  ok('stop_sequences: no 3-character run in the greedy text (skipped)');
}

// system prompt, content blocks, thinking on: accepted, the system prompt counts
const sys = await client.messages.create({
  model, max_tokens: 4, temperature: 0, system: [{ type: 'text', text: 'You are terse.' }],
  thinking: { type: 'enabled', budget_tokens: 1024 },
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me about the weather.' }] }],
});
assert.ok(sys.usage.input_tokens + (sys.usage.cache_read_input_tokens ?? 0) >
          whole.usage.input_tokens + (whole.usage.cache_read_input_tokens ?? 0));
ok('system prompt and thinking accepted');

// tools, and a conversation that used one: the tool_use and tool_result blocks reach the prompt
const tools = [{
  name: 'get_weather', description: 'The weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const history = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { role: 'assistant', content: [{ type: 'text', text: 'Let me look.' },
    { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } }] },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: '18 degrees, sunny' }] },
];
const withTools = await client.messages.create({ model, max_tokens: 8, temperature: 0, tools, tool_choice: { type: 'auto' }, messages: history });
assert.equal(withTools.type, 'message');
assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(withTools.stop_reason));
for (const b of withTools.content) assert.ok(['text', 'thinking', 'tool_use'].includes(b.type));
const short = await client.messages.countTokens({ model, messages: history.slice(0, 1) });
const long = await client.messages.countTokens({ model, messages: history, tools });
assert.ok(short.input_tokens > 0);
assert.ok(long.input_tokens > short.input_tokens + 5, `${long.input_tokens} vs ${short.input_tokens}`);
ok(`tools with tool_use/tool_result history: ${withTools.stop_reason}; count_tokens ${short.input_tokens} -> ${long.input_tokens}`);

const ts = client.messages.stream({ model, max_tokens: 8, temperature: 0, tools, messages: history });
const tfinal = await ts.finalMessage();
assert.deepEqual(tfinal.content.map((b) => b.type), withTools.content.map((b) => b.type));
ok('tools, streamed: the same blocks');

// a forced call (tool_choice any, or the tool named; one call): when the chat layer forces tool
// calls (its grammar), the Messages answer is a tool_use block whose input follows the schema,
// whole and streamed, the same call the chat API makes of the same prompt (greedy)
const ping = { name: 'ping', input_schema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false } };
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const forcedChat = await fetch(`${baseURL}/v1/chat/completions`, {
  method: 'POST', headers: { Authorization: `Bearer ${process.env.STRATA_API_KEY ?? 'none'}` },
  body: JSON.stringify({ model, messages: ask, max_tokens: 100, temperature: 0, tool_choice: 'required', parallel_tool_calls: false,
    tools: [{ type: 'function', function: { name: ping.name, parameters: ping.input_schema } }] }),
}).then((r) => r.json());
const chatCall = forcedChat.choices?.[0]?.message?.tool_calls?.[0];
if (chatCall) {
  const forced = await client.messages.create({ model, max_tokens: 100, temperature: 0, tools: [ping],
    tool_choice: { type: 'any', disable_parallel_tool_use: true }, messages: ask });
  assert.equal(forced.stop_reason, 'tool_use');
  const uses = forced.content.filter((b) => b.type === 'tool_use');
  assert.equal(uses.length, 1);
  assert.equal(uses[0].name, 'ping');
  assert.equal(typeof uses[0].input.ok, 'boolean');
  assert.deepEqual(uses[0].input, JSON.parse(chatCall.function.arguments));
  const fs = client.messages.stream({ model, max_tokens: 100, temperature: 0, tools: [ping],
    tool_choice: { type: 'tool', name: 'ping', disable_parallel_tool_use: true }, messages: ask });
  const ffinal = await fs.finalMessage();
  assert.equal(ffinal.stop_reason, 'tool_use');
  assert.deepEqual(ffinal.content.filter((b) => b.type === 'tool_use').map((b) => b.input), [uses[0].input]);
  ok(`forced tool call: tool_use ping ${JSON.stringify(uses[0].input)}, whole and streamed`);
} else {
  ok('forced tool call: skipped (the chat layer makes no tool calls)');
}

// the same long prompt twice: the second reads it from the worker's prefix cache
const longPrompt = [{ role: 'user', content: 'Describe, at length, the weather of every season in a coastal town. '.repeat(4) }];
await client.messages.create({ model, max_tokens: 2, temperature: 0, messages: longPrompt });
const again = await client.messages.create({ model, max_tokens: 2, temperature: 0, messages: longPrompt });
assert.ok(again.usage.cache_read_input_tokens > 0, JSON.stringify(again.usage));
ok(`prefix cache: cache_read_input_tokens ${again.usage.cache_read_input_tokens}, input_tokens ${again.usage.input_tokens}`);

// errors in Anthropic's shape, mapped by the client
await assert.rejects(
  client.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
  (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.error?.type === 'invalid_request_error');
ok('an image block: BadRequestError, invalid_request_error');
if (process.env.STRATA_API_KEY) {
  const bad = new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model, max_tokens: 4, messages }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error');
  ok('a wrong x-api-key: AuthenticationError');
}
