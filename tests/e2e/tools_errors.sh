#!/bin/bash
# tools_errors.sh — curl over the tool and structured-output error cases of a running frontend
# (PORT): each gives a clear 400 naming the field, or a finish reason; none hangs.
set -u
fail=0
post() { curl -s -m 30 -H 'Content-Type: application/json' "http://127.0.0.1:$PORT/v1/chat/completions" -d "$1"; }
expect() { # name, body, jq-free grep pattern
    out=$(post "$2")
    if grep -q -- "$3" <<<"$out"; then echo "ok - $1"; else echo "FAIL - $1: $out"; fail=1; fi
}
M='"messages": [{"role": "user", "content": "hi"}]'
T='"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}]'
expect "bad schema" "{$M, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"^x\"}}}}}}" '"param":"response_format.json_schema.schema"'
expect "bad grammar" "{$M, \"grammar\": \"root ::= [a-\"}" '"param":"grammar"'
expect "unknown tool" "{$M, $T, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}" '"code":"unknown_tool"'
expect "bad tool schema" "{$M, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"\$ref\": \"#/nowhere\"}}}]}" '"param":"tools\[0\]"'
expect "required without tools" "{$M, \"tool_choice\": \"required\"}" '"param":"tool_choice"'
expect "forced call with a format" "{$M, $T, \"tool_choice\": \"required\", \"response_format\": {\"type\": \"json_object\"}}" '"param":"tool_choice"'
# a call the model could not close in its budget: a length finish and the text, no tool_calls
expect "unclosed call" "{$M, $T, \"tool_choice\": \"required\", \"max_tokens\": 3}" '"finish_reason":"length"'
out=$(post "{$M, $T, \"tool_choice\": \"required\", \"max_tokens\": 3}")
if grep -q '"tool_calls"' <<<"$out"; then echo "FAIL - unclosed call has tool_calls: $out"; fail=1; fi
exit $fail
