// chat.js — the chat page: conversations kept in this browser, answers streamed from
// /v1/chat/completions (SSE), a stop button, the system prompt and sampling settings, reasoning
// (delta.reasoning_content) shown apart, the model's name and the context the conversation uses.
'use strict';

const $ = (id) => document.getElementById(id);
const STORE = 'strata-chats', SETTINGS = 'strata-chat-settings';
const FIELDS = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed', 'repeat_penalty'];
const LONG = 2000; // characters of a user message shown
let model = null, nCtx = 0, convs = [], cur = null, controller = null;

function save() {
  try { localStorage.setItem(STORE, JSON.stringify(convs.slice(0, 50))); } catch (_) { /* full */ }
}

function load() {
  try { convs = JSON.parse(localStorage.getItem(STORE) || '[]'); } catch (_) { convs = []; }
  const s = JSON.parse(localStorage.getItem(SETTINGS) || '{}');
  for (const f of FIELDS) if (s[f] !== undefined) $(f).value = s[f];
  if (s.system !== undefined) $('system').value = s.system;
}

function saveSettings() {
  const s = { system: $('system').value };
  for (const f of FIELDS) s[f] = $(f).value;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}

function newConv() {
  cur = { id: Date.now().toString(36), title: 'New conversation', messages: [], used: 0 };
  convs.unshift(cur);
  showConv();
}

function listConvs() {
  const ul = $('convs');
  ul.replaceChildren();
  for (const c of convs) {
    const li = Strata.el('li', c === cur ? 'here' : null, c.title);
    li.onclick = () => { if (!controller) { cur = c; showConv(); } };
    ul.append(li);
  }
}

function showCtx() {
  const used = cur?.used || 0;
  $('ctx').firstElementChild.style.width = nCtx ? `${Math.min(100, (100 * used) / nCtx)}%` : '0';
  $('ctxtext').textContent = nCtx ? `${used} / ${nCtx} tokens` : '';
}

// bubble renders one message; returns its node (the answer's is updated as it streams).
function bubble(m) {
  const d = Strata.el('div', `msg ${m.role === 'user' ? 'user' : m.error ? 'error' : 'assistant'}`);
  d.dataset.state = m.state || 'done';
  d.append(Strata.el('div', 'who', m.role === 'user' ? 'You' : m.error ? 'Error' : model || 'assistant'));
  const r = Strata.el('details', 'reasoning');
  r.append(Strata.el('summary', null, 'Reasoning'), Strata.el('div', 'rbody'));
  r.hidden = true;
  d.append(r, Strata.el('div', 'body'), Strata.el('div', 'stats'));
  fill(d, m);
  $('log').append(d);
  return d;
}

function fill(d, m) {
  d.dataset.state = m.state || 'done';
  const r = d.querySelector('.reasoning');
  r.hidden = !m.reasoning;
  if (m.reasoning) r.querySelector('.rbody').textContent = m.reasoning;
  const body = d.querySelector('.body');
  if (m.error) body.textContent = m.error;
  else if (m.role !== 'user') Strata.markdown(body, m.content);
  else if (m.content.length <= LONG) body.textContent = m.content;
  else { // a long paste is shown cut (it is sent whole)
    body.textContent = m.content.slice(0, LONG);
    body.append(Strata.el('div', 'more', `… ${m.content.length - LONG} more characters`));
  }
  d.querySelector('.stats').textContent = m.stats || '';
}

function showConv() {
  $('log').replaceChildren();
  for (const m of cur.messages) bubble(m);
  listConvs();
  showCtx();
  $('log').scrollTop = $('log').scrollHeight;
}

function settings() {
  const num = (id, int) => {
    const v = $(id).value.trim();
    if (v === '') return undefined;
    return int ? parseInt(v, 10) : parseFloat(v);
  };
  const p = {
    temperature: num('temperature'), top_p: num('top_p'), top_k: num('top_k', true),
    min_p: num('min_p'), max_tokens: num('max_tokens', true), seed: num('seed', true),
    repeat_penalty: num('repeat_penalty'),
  };
  for (const k of Object.keys(p)) if (p[k] === undefined || Number.isNaN(p[k])) delete p[k];
  return p;
}

// events splits an SSE buffer into complete events' data, returning the rest.
function events(buf, out) {
  let i;
  while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
    const ev = buf.slice(0, i);
    buf = buf.slice(i).replace(/^\r?\n\r?\n/, '');
    const data = ev.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart());
    if (data.length) out.push(data.join('\n'));
  }
  return buf;
}

async function send(text) {
  if (!cur) newConv();
  if (cur.messages.length === 0) cur.title = text.slice(0, 40) || 'New conversation';
  const user = { role: 'user', content: text };
  cur.messages.push(user);
  bubble(user);
  const sys = $('system').value.trim();
  const msgs = (sys ? [{ role: 'system', content: sys }] : []).concat(
    cur.messages.filter((m) => !m.error && !m.refused).map((m) => ({ role: m.role, content: m.content })));
  const ans = { role: 'assistant', content: '', reasoning: '', state: 'streaming' };
  const node = bubble(ans);
  listConvs();
  controller = new AbortController();
  $('stop').disabled = false;
  $('send').disabled = true;
  const t0 = performance.now();
  let usage = null, finish = null, timings = null, queued = false;
  const redraw = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      fill(node, ans);
      $('log').scrollTop = $('log').scrollHeight;
    });
  };
  const fail = (msg) => {
    ans.error = msg;
    ans.state = 'error';
    node.className = 'msg error';
    node.querySelector('.who').textContent = 'Error';
  };
  try {
    const res = await Strata.api('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(Object.assign({ model: model || 'strata', messages: msgs, stream: true,
        stream_options: { include_usage: true } }, settings())),
      signal: controller.signal,
    });
    if (!res.ok) {
      // the API refused the message (too long, bad settings): it stays on screen, out of the
      // conversation the next messages send
      fail(await Strata.errorText(res));
      user.refused = true;
    } else {
      const reader = res.body.getReader(), dec = new TextDecoder();
      let buf = '', done = false;
      while (!done) {
        const { value, done: end } = await reader.read();
        if (end) break;
        const evs = [];
        buf = events(buf + dec.decode(value, { stream: true }), evs);
        for (const data of evs) {
          if (data === '[DONE]') { done = true; break; }
          const j = JSON.parse(data);
          if (j.error) { fail(`the server stopped the answer: ${j.error.message}`); continue; }
          if (j.usage) usage = j.usage;
          const c = j.choices?.[0];
          if (!c) continue;
          if (c.delta?.content) ans.content += c.delta.content;
          if (c.delta?.reasoning_content) ans.reasoning += c.delta.reasoning_content;
          if (c.finish_reason) finish = c.finish_reason;
          if (j.timings) timings = j.timings;
        }
        redraw();
      }
      if (!done && ans.state === 'streaming') {
        fail('the connection closed before the answer ended');
        Strata.connLost('the answer was cut off');
      } else if (ans.state === 'streaming') {
        ans.state = 'done';
      }
    }
  } catch (e) {
    if (controller.signal.aborted) {
      ans.state = 'stopped';
    } else {
      fail(`connection lost: ${e.message}`);
      Strata.connLost(e.message);
    }
  }
  const secs = (performance.now() - t0) / 1000;
  if (ans.state === 'stopped') ans.stats = `stopped after ${secs.toFixed(1)} s`;
  else if (ans.state === 'done') {
    const n = usage?.completion_tokens ?? timings?.predicted_n;
    ans.stats = `${n ?? '?'} tokens, ${secs.toFixed(1)} s` +
      (timings?.predicted_per_second ? `, ${timings.predicted_per_second.toFixed(1)} tok/s` : '') +
      (finish ? `, ${finish}` : '');
  }
  if (usage) cur.used = usage.total_tokens;
  cur.messages.push(ans);
  fill(node, ans);
  controller = null;
  $('stop').disabled = true;
  $('send').disabled = false;
  showCtx();
  save();
}

async function loadModel() {
  try {
    const res = await Strata.api('/v1/models');
    if (!res.ok) {
      $('model').textContent = res.status === 503 ? 'model loading…' : await Strata.errorText(res);
      setTimeout(loadModel, 2000);
      return;
    }
    const j = await res.json();
    model = j.data[0].id;
    nCtx = j.data[0].meta?.n_ctx || 0;
    $('model').textContent = model;
    document.body.dataset.model = model;
    showCtx();
  } catch (e) {
    $('model').textContent = 'not connected';
    Strata.connLost(e.message);
  }
}

document.addEventListener('DOMContentLoaded', () => {
  load();
  if (convs.length) { cur = convs[0]; showConv(); } else newConv();
  $('new').onclick = () => { if (!controller) newConv(); };
  $('stop').onclick = () => controller?.abort();
  for (const f of FIELDS.concat(['system'])) $(f).addEventListener('change', saveSettings);
  $('ask').onsubmit = (ev) => {
    ev.preventDefault();
    const text = $('input').value;
    if (!text.trim() || controller) return;
    $('input').value = '';
    send(text);
  };
  $('input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('ask').requestSubmit(); }
  });
  document.addEventListener('strata-reconnected', () => { if (!model) loadModel(); });
  loadModel();
});
