#!/usr/bin/env bash
# run.sh — parity with llama.cpp (docs/design.md §7), teacher-forced: for tiny fixtures of every
# architecture (qwen3moe, llama with fused experts, olmoe, qwen2moe) in f32, q8_0, q4_k and the
# q4_k_m mix, gpt-oss (sinks, sliding windows, biases, YaRN) in f32 and the mxfp4_moe mix (MXFP4
# experts), glm4moe and deepseek2 in f32, q8_0 and the q4_k_m mix (deepseek2 also with the older
# attn_kv_b layout), llama.cpp (node-llama-cpp's prebuilt CPU binary) greedily continues a fixed
# prompt of token ids; `strata run --teacher` scores that continuation; check.mjs prints the table
# and fails the stage when a step's token is neither strata's argmax nor within the stated
# tolerance of it.
#
#   tests/llamacpp/run.sh [BUILD_DIR]     (default: build; needs BUILD_DIR/strata)
#
# node-llama-cpp is installed into BUILD_DIR/llamacpp-node with `npm ci` from the committed lock
# file (only the linux-x64 CPU binary: --omit=optional drops the CUDA and Vulkan ones). Without
# node >= 20 and npm, on another platform, or when the npm registry cannot be reached, the stage
# prints SKIP and succeeds. LLAMACPP_PROMPT (comma-separated ids < 512) and LLAMACPP_STEPS override
# the prompt and the number of greedy steps.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
strata=$build/strata
node_dir=$build/llamacpp-node
work=$build/llamacpp-work
prompt=${LLAMACPP_PROMPT:-1,17,300,42,99,7,256,128}
steps=${LLAMACPP_STEPS:-32}
archs="qwen3moe llama olmoe qwen2moe"
types="f32 q8_0 q4_k q4_k_m"
cases=""
for arch in $archs; do for type in $types; do cases="$cases $arch:$type"; done; done
cases="$cases gpt-oss:f32 gpt-oss:mxfp4_moe"
# glm4moe (GLM-4.5: a dense layer, sigmoid routing with its selection bias and scaling, an ungated
# shared expert, partial rotary, q/k norms, biases; the MTP layer in the file, never run)
cases="$cases glm4moe:f32 glm4moe:q8_0 glm4moe:q4_k_m"
# deepseek2 (MLA with both LoRAs, the latent cached; group-limited sigmoid routing with the bias,
# scaling, shared expert, dense layer; YaRN with DeepSeek's mscale), and f32_old: the older
# converters' attn_kv_b, which llama.cpp runs without MLA and strata as MLA
cases="$cases deepseek2:f32 deepseek2:q8_0 deepseek2:q4_k_m deepseek2:f32_old"

skip() { echo "SKIP llama.cpp parity: $*"; exit 0; }

[ -x "$strata" ] || { echo "run.sh: $strata is missing: build strata first" >&2; exit 1; }
[ "$(uname -sm)" = "Linux x86_64" ] ||
  skip "the pinned node-llama-cpp binary is @node-llama-cpp/linux-x64; this is $(uname -sm)"
command -v node >/dev/null && command -v npm >/dev/null ||
  skip "node and npm are not installed (node-llama-cpp 3.21.1 needs Node.js >= 20)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] ||
  skip "node $(node --version) is too old: node-llama-cpp 3.21.1 needs Node.js >= 20"

# Install again only when the lock file changed, so a warm build directory costs nothing.
if ! cmp -s "$here/package-lock.json" "$node_dir/package-lock.json" ||
   [ ! -d "$node_dir/node_modules/@node-llama-cpp/linux-x64" ]; then
  timeout 30 npm ping >/dev/null 2>&1 || skip "the npm registry ($(npm config get registry)) cannot be reached"
  rm -rf "$node_dir" && mkdir -p "$node_dir"
  cp "$here/package.json" "$here/package-lock.json" "$node_dir/"
  # --ignore-scripts: node-llama-cpp's postinstall would try to build llama.cpp when no prebuilt
  # binary fits; here the prebuilt one must be used or the stage must fail.
  npm ci --prefix "$node_dir" --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error
fi
# One CPU variant of ggml for the reference on every machine: the prebuilt package carries a
# libggml-cpu-*.so per x86 level and loads the best this CPU has, and its variants' own rounding
# differs (on a Zen 5, the zen4 (AVX-512) variant and the haswell (AVX2) one continue glm4moe's
# q4_k_m fixture differently from step 19), while strata's logits are the same bits on every ISA.
# haswell (AVX2, FMA, F16C) runs on every machine CI has.
bins=$node_dir/node_modules/@node-llama-cpp/linux-x64/bins
grep -qw avx2 /proc/cpuinfo || skip "the pinned reference (ggml's haswell variant) needs AVX2"
[ -n "$(find "$bins" -name 'libggml-cpu-haswell.so' 2>/dev/null)" ] ||
  { echo "run.sh: node-llama-cpp has no libggml-cpu-haswell.so under $bins" >&2; exit 1; }
find "$bins" -name 'libggml-cpu-*.so' ! -name 'libggml-cpu-haswell.so' -delete
# Scripts beside node_modules: ES module imports resolve from the importing file's folder.
cp "$here/greedy.mjs" "$here/check.mjs" "$node_dir/"

rm -rf "$work" && mkdir -p "$work"
models=()
for c in $cases; do
    arch=${c%%:*} type=${c#*:}
    f=$work/$arch-$type
    if [ "$type" = q4_k_m ]; then qopt=(--mix q4_k_m)
    elif [ "$type" = f32_old ]; then qopt=(--type f32 --old-layout)
    else qopt=(--type "$type"); fi
    "$strata" fixture --arch "$arch" "${qopt[@]}" -o "$f.gguf" >/dev/null
    node "$node_dir/greedy.mjs" "$f.gguf" "$prompt" "$steps" >"$f.llama.json"
    ids=$(node -p "JSON.parse(require('fs').readFileSync('$f.llama.json', 'utf8')).ids.join(',')")
    if ! "$strata" run "$f.gguf" --ids "$prompt" --teacher "$ids" >"$f.strata.json" 2>"$f.log"; then
      cat "$f.log" >&2
      exit 1
    fi
    rm -f "$f.gguf"
    [ "$arch:$type" = qwen3moe:q8_0 ] && ids_qwen3moe_q8_0=$ids
    models+=("$arch:$type")
done
node "$node_dir/check.mjs" "$work" "${models[@]}"

# The control: strata scoring llama.cpp's continuation with other weights (seed 1) must fail, or
# the check above proves nothing.
f=$work/control-q8_0
"$strata" fixture --arch qwen3moe --type q8_0 --seed 1 -o "$f.gguf" >/dev/null
cp "$work/qwen3moe-q8_0.llama.json" "$f.llama.json"
"$strata" run "$f.gguf" --ids "$prompt" --teacher "$ids_qwen3moe_q8_0" >"$f.strata.json" 2>"$f.log"
if node "$node_dir/check.mjs" "$work" control:q8_0 >"$f.check" 2>&1; then
  cat "$f.check"
  echo "run.sh: the check passed strata on a model with other weights: it cannot tell models apart" >&2
  exit 1
fi
echo "control: other weights (seed 1) fail the check, as they must"
