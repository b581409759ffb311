#!/usr/bin/env bash
# errors.sh — every error path of strata-frontend with curl: status, OpenAI's error shape, headers.
# Env: PORT (a frontend started with --api-key $KEY --max-tokens 64 --max-body 65536 over a worker
# with a context of 4096), KEY, BUSY_PORT (one with --max-active 1 over the same worker), NOWORKER_PORT (one
# whose only worker does not exist).
set -u
base="http://127.0.0.1:$PORT"
fails=0

# check NAME WANT_STATUS CURL_ARGS...: the status must be WANT_STATUS and a 4xx/5xx body must be
# {"error": {"message", "type", "param", "code"}}
check() {
  local name=$1 want=$2
  shift 2
  local out status
  out=$(curl -s -o /tmp/errors.$$.body -D /tmp/errors.$$.head -w '%{http_code}' "$@")
  status=$out
  if [ "$status" != "$want" ]; then
    echo "FAIL $name: status $status, want $want: $(head -c 300 /tmp/errors.$$.body)"
    fails=$((fails + 1))
    return
  fi
  if [ "$want" -ge 400 ] && ! grep -q '"error":{"message":"[^"]*.*"type":"[a-z_]*","param":.*"code":' /tmp/errors.$$.body; then
    echo "FAIL $name: not OpenAI's error shape: $(head -c 300 /tmp/errors.$$.body)"
    fails=$((fails + 1))
    return
  fi
  echo "ok - $name ($status)"
}

auth=(-H "Authorization: Bearer $KEY" -H 'Content-Type: application/json')
chat="$base/v1/chat/completions"
msgs='"messages":[{"role":"user","content":"hi"}]'

check 'malformed JSON' 400 "${auth[@]}" -d '{"messages": [' "$chat"
check 'body not an object' 400 "${auth[@]}" -d '[1,2]' "$chat"
check 'messages missing' 400 "${auth[@]}" -d '{}' "$chat"
check 'messages of the wrong type' 400 "${auth[@]}" -d '{"messages":"hi"}' "$chat"
check 'temperature of the wrong type' 400 "${auth[@]}" -d "{$msgs,\"temperature\":\"hot\"}" "$chat"
check 'stream of the wrong type' 400 "${auth[@]}" -d "{$msgs,\"stream\":1}" "$chat"
check 'n = 17 (above 16)' 400 "${auth[@]}" -d "{$msgs,\"n\":17}" "$chat"
check 'max_tokens 0' 400 "${auth[@]}" -d "{$msgs,\"max_tokens\":0}" "$chat"
check 'max_tokens above --max-tokens' 400 "${auth[@]}" -d "{$msgs,\"max_tokens\":65}" "$chat"
check 'max_completion_tokens above --max-tokens' 400 "${auth[@]}" -d "{$msgs,\"max_completion_tokens\":1000}" "$chat"
check 'top_logprobs without logprobs' 400 "${auth[@]}" -d "{$msgs,\"top_logprobs\":2}" "$chat"
ids=$(seq -s, 4200 | sed 's/[0-9]*/7/g')
check 'prompt longer than the context' 400 "${auth[@]}" -d "{\"prompt\":[$ids]}" "$base/v1/completions"
grep -q context_length_exceeded /tmp/errors.$$.body || { echo "FAIL: no context_length_exceeded code"; fails=$((fails + 1)); }
check 'token id outside the vocabulary' 400 "${auth[@]}" -d '{"prompt":[1,99999999]}' "$base/v1/completions"
head -c 70000 /dev/zero | tr '\0' ' ' > /tmp/errors.$$.big
check 'body over --max-body' 413 "${auth[@]}" --data-binary @/tmp/errors.$$.big "$chat"
check 'no API key' 401 -H 'Content-Type: application/json' -d "{$msgs}" "$chat"
check 'wrong API key' 401 -H 'Authorization: Bearer nope' -d "{$msgs}" "$chat"
check 'unknown endpoint' 404 "${auth[@]}" "$base/v1/embeddings" -d '{}'
check 'GET on a POST endpoint' 405 "${auth[@]}" "$chat"
check 'health needs no key' 200 "$base/health"
check 'a good request still works' 200 "${auth[@]}" -d "{$msgs,\"max_tokens\":4}" "$chat"

# busy: --max-active 1, so concurrent requests beyond the first are refused with Retry-After
chat="http://127.0.0.1:$BUSY_PORT/v1/chat/completions"
busy=0
for round in 1 2 3 4 5; do
  for i in 1 2 3 4 5 6 7 8; do
    curl -s -o /dev/null -D /tmp/errors.$$.busy$i -w '%{http_code}\n' "${auth[@]}" \
      -d "{$msgs,\"max_tokens\":64}" "$chat" > /tmp/errors.$$.code$i &
  done
  wait
  for i in 1 2 3 4 5 6 7 8; do
    if grep -q 429 /tmp/errors.$$.code$i && grep -qi '^Retry-After: 1' /tmp/errors.$$.busy$i; then busy=1; fi
  done
  [ $busy = 1 ] && break
done
if [ $busy = 1 ]; then echo "ok - busy (429 with Retry-After)"; else echo "FAIL busy: no 429"; fails=$((fails + 1)); fi

base="http://127.0.0.1:$NOWORKER_PORT"
check 'no worker: health' 503 "$base/health"
check 'no worker: chat' 503 -d "{$msgs}" "$base/v1/chat/completions"

rm -f /tmp/errors.$$.*
if [ $fails -ne 0 ]; then
  echo "$fails error checks failed"
  exit 1
fi
echo "all error checks passed"
