// common.js — what both pages share: the API key (asked once, kept in this browser), calls to the
// frontend, the connection banner, and a markdown renderer that builds DOM nodes from text only
// (textContent, never innerHTML), so nothing a model writes can become markup or script.
'use strict';

const Strata = (() => {
  const KEY = 'strata-api-key';
  let asking = null;

  // askKey shows the key dialog once; every caller waiting on a 401 shares the same answer.
  function askKey(why) {
    if (asking) return asking;
    const dlg = document.getElementById('keybox');
    dlg.querySelector('.why').textContent = why;
    dlg.querySelector('input').value = '';
    asking = new Promise((resolve) => {
      dlg.querySelector('form').onsubmit = (ev) => {
        ev.preventDefault();
        const k = dlg.querySelector('input').value.trim();
        localStorage.setItem(KEY, k);
        dlg.close();
        asking = null;
        resolve(k);
      };
    });
    dlg.showModal();
    return asking;
  }

  // api calls the frontend with the key; a 401 asks for the key and tries again.
  async function api(path, opts = {}) {
    for (let attempt = 0; ; attempt++) {
      const headers = Object.assign({}, opts.headers || {});
      const key = localStorage.getItem(KEY);
      if (key) headers.Authorization = `Bearer ${key}`;
      const res = await fetch(path, Object.assign({}, opts, { headers }));
      if (res.status !== 401 || attempt > 3) return res;
      const body = await res.json().catch(() => ({}));
      await askKey(body?.error?.message ?? 'This server needs an API key.');
    }
  }

  // errorText reads an API error (OpenAI's shape) out of a response.
  async function errorText(res) {
    const t = await res.text().catch(() => '');
    try {
      const j = JSON.parse(t);
      if (j?.error?.message) return `${res.status}: ${j.error.message}`;
    } catch (_) { /* not JSON */ }
    return `${res.status} ${res.statusText}${t ? `: ${t.slice(0, 300)}` : ''}`;
  }

  // The connection banner: down (with why) until the server answers /health again, then "back"
  // for a few seconds. Both pages poll through it.
  let down = false, backTimer = null, healthTimer = null;
  function connLost(why) {
    const el = document.getElementById('conn');
    if (!down) {
      down = true;
      clearTimeout(backTimer);
      el.className = 'down';
      el.textContent = `Connection to the server lost (${why}): reconnecting…`;
      document.body.dataset.conn = 'down';
      const probe = async () => {
        try {
          const r = await fetch('/health', { cache: 'no-store' });
          if (r.ok) return connBack();
        } catch (_) { /* still down */ }
        healthTimer = setTimeout(probe, 1000);
      };
      healthTimer = setTimeout(probe, 500);
    }
  }
  function connBack() {
    const el = document.getElementById('conn');
    clearTimeout(healthTimer);
    if (!down) return;
    down = false;
    el.className = 'back';
    el.textContent = 'Reconnected to the server.';
    document.body.dataset.conn = 'back';
    document.dispatchEvent(new Event('strata-reconnected'));
    backTimer = setTimeout(() => { el.className = ''; document.body.dataset.conn = 'up'; }, 4000);
  }

  // ---- markdown, safely ----------------------------------------------------------------------
  // Blocks: ``` fences, # headings, - * + and 1. lists, > quotes, paragraphs. Inline: `code`,
  // **bold**, *em*, [text](http(s) URL). Everything else is text.
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function inline(parent, text) {
    const re = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\[([^\]]+)\]\(([^)\s]+)\)/g;
    let last = 0, m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parent.append(text.slice(last, m.index));
      if (m[2] !== undefined) parent.append(el('code', null, m[2]));
      else if (m[3] !== undefined) inline(parent.appendChild(el('strong')), m[3]);
      else if (m[4] !== undefined) inline(parent.appendChild(el('em')), m[4]);
      else {
        let url = null;
        try { url = new URL(m[6], location.href); } catch (_) { /* not a URL */ }
        if (url && (url.protocol === 'http:' || url.protocol === 'https:')) {
          const a = el('a', null, m[5]);
          a.href = url.href;
          a.rel = 'noopener noreferrer nofollow';
          a.target = '_blank';
          parent.append(a);
        } else {
          parent.append(m[0]);
        }
      }
      last = re.lastIndex;
    }
    if (last < text.length) parent.append(text.slice(last));
  }

  function markdown(target, src) {
    target.replaceChildren();
    const lines = src.split('\n');
    let para = [], list = null;
    const flush = () => {
      if (para.length) inline(target.appendChild(el('p')), para.join('\n'));
      para = [];
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      let m;
      if ((m = /^\s*(```+|~~~+)\s*([\w+-]*)/.exec(line))) {
        flush(); list = null;
        const fence = m[1], body = [];
        for (i++; i < lines.length && !lines[i].trimStart().startsWith(fence); i++) body.push(lines[i]);
        const pre = el('pre'), code = el('code', null, body.join('\n'));
        if (m[2]) code.dataset.lang = m[2];
        pre.append(code);
        target.append(pre);
      } else if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
        flush(); list = null;
        inline(target.appendChild(el(`h${Math.min(6, m[1].length + 2)}`)), m[2]);
      } else if ((m = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line))) {
        flush();
        const tag = /\d/.test(m[1]) ? 'ol' : 'ul';
        if (!list || list.tagName.toLowerCase() !== tag) list = target.appendChild(el(tag));
        inline(list.appendChild(el('li')), m[2]);
      } else if ((m = /^>\s?(.*)$/.exec(line))) {
        flush(); list = null;
        inline(target.appendChild(el('blockquote')), m[1]);
      } else if (line.trim() === '') {
        flush(); list = null;
      } else {
        list = null;
        para.push(line);
      }
    }
    flush();
  }

  return { api, errorText, connLost, connBack, markdown, el, askKey };
})();
