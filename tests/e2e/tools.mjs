// tools.mjs — the official `openai` npm client against `strata serve`: forced and named tool calls
// (whole and streamed, arguments checked against the function's parameters), tool_choice auto and
// none, a tool result sent back, and structured output (json_object and a strict json_schema).
// The model is a random-weight fixture: only what a grammar forces is asserted beyond the shapes.
// Env: STRATA_PORT, STRATA_NODE_MODULES (a folder holding node_modules/openai).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.STRATA_NODE_MODULES ?? '.', 'noop.js'));
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: `http://127.0.0.1:${process.env.STRATA_PORT}/v1`, apiKey: 'none', maxRetries: 0 });
const ok = (what) => console.log(`ok - ${what}`);
const model = (await client.models.list()).data[0].id;

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: {
        type: 'object',
        properties: { unit: { type: 'string', enum: ['c', 'f'] }, days: { type: 'integer' } },
        required: ['unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'ping',
      description: 'Ping',
      parameters: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false },
    },
  },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkCall(call, only) {
  assert.equal(call.type, 'function');
  assert.ok(call.id.length > 0);
  if (only) assert.equal(call.function.name, only);
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    assert.ok(['c', 'f'].includes(args.unit), call.function.arguments);
    assert.ok(args.days === undefined || Number.isInteger(args.days));
    assert.deepEqual(Object.keys(args).filter((k) => !['unit', 'days'].includes(k)), []);
  } else {
    assert.equal(call.function.name, 'ping');
    assert.equal(typeof args.ok, 'boolean');
  }
}

// forced: required, then a named function, over seeds; a call cut by max_tokens is text
let calls = 0;
for (let seed = 0; seed < 6; seed++) {
  const only = seed % 2 ? 'ping' : null;
  const r = await client.chat.completions.create({
    model, messages, tools, seed, max_tokens: 100, parallel_tool_calls: seed % 3 === 0,
    tool_choice: only ? { type: 'function', function: { name: only } } : 'required',
  });
  const c = r.choices[0];
  if (c.finish_reason === 'tool_calls') {
    assert.ok(c.message.tool_calls.length >= 1);
    if (seed % 3) assert.equal(c.message.tool_calls.length, 1);
    c.message.tool_calls.forEach((t) => checkCall(t, only));
    calls++;
  } else {
    assert.equal(c.finish_reason, 'length');
    assert.equal(c.message.tool_calls, undefined);
  }
}
assert.ok(calls > 0);
ok(`forced tool calls: ${calls} of 6 complete, arguments valid`);

// streamed: the client accumulates the deltas into the same calls
const stream = await client.chat.completions.create({
  model, messages, tools, seed: 1, max_tokens: 100, stream: true,
  tool_choice: { type: 'function', function: { name: 'ping' } },
});
const acc = [];
let finish = null;
for await (const ch of stream) {
  const d = ch.choices[0]?.delta;
  for (const t of d?.tool_calls ?? []) {
    acc[t.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
    if (t.id) acc[t.index].id = t.id;
    if (t.function?.name) acc[t.index].function.name += t.function.name;
    if (t.function?.arguments) acc[t.index].function.arguments += t.function.arguments;
  }
  finish = ch.choices[0]?.finish_reason ?? finish;
}
assert.equal(finish, 'tool_calls');
assert.equal(acc.length, 1);
checkCall(acc[0], 'ping');
ok(`streamed tool call: ${acc[0].function.arguments}`);

// auto and none: a random model rarely calls, but a call it begins under auto is held to the
// tools' grammar, so any call it makes validates; a tool result goes back
for (const tool_choice of ['auto', 'none']) {
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.create({ model, messages, tools, tool_choice, max_tokens: 40, seed });
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
    if (tool_choice === 'none') assert.equal(r.choices[0].message.tool_calls, undefined);
    for (const c of r.choices[0].message.tool_calls ?? []) checkCall(c);
  }
}
const history = [
  ...messages,
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function', function: { name: 'get_weather', arguments: '{"unit":"c"}' } }] },
  { role: 'tool', tool_call_id: 'call_abc', content: '21 degrees' },
];
const back = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 8 });
assert.equal(typeof back.choices[0].message.content, 'string');
ok('tool_choice auto and none, a tool result sent back');

// structured output
const schema = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 10 }, temps: { type: 'array', items: { type: 'number' }, maxItems: 3 }, sunny: { type: 'boolean' } },
  required: ['sunny', 'temps'],
  additionalProperties: false,
};
let stops = 0;
for (let seed = 0; seed < 6; seed++) {
  const r = await client.chat.completions.create({
    model, messages, seed, max_tokens: 120,
    response_format: { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema } },
  });
  const c = r.choices[0];
  if (c.finish_reason !== 'stop') continue;
  const v = JSON.parse(c.message.content);
  assert.equal(typeof v.sunny, 'boolean');
  assert.ok(Array.isArray(v.temps) && v.temps.length <= 3 && v.temps.every((t) => typeof t === 'number'));
  assert.ok(v.city === undefined || (typeof v.city === 'string' && [...v.city].length <= 10));
  assert.deepEqual(Object.keys(v).filter((k) => !['city', 'temps', 'sunny'].includes(k)), []);
  stops++;
}
assert.ok(stops > 0);
ok(`json_schema: ${stops} of 6 stopped, each valid`);
let text = '';
for await (const ch of await client.chat.completions.create({
  model, messages, seed: 4, max_tokens: 120, stream: true, response_format: { type: 'json_object' },
}))
  text += ch.choices[0]?.delta?.content ?? '';
if (text.trim().endsWith('}')) assert.equal(typeof JSON.parse(text), 'object');
ok('json_object, streamed');

// errors the client raises
await assert.rejects(
  client.chat.completions.create({ model, messages, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
  (e) => e.status === 400 && /nope/.test(e.message),
);
await assert.rejects(
  client.chat.completions.create({ model, messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'strnig' } } } }),
  (e) => e.status === 400 && /unknown type/.test(e.message),
);
ok('errors: an unknown tool, a bad schema');
