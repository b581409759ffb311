// bench_llama.mjs — llama.cpp's side of `strata bench --llama`: the same prompt and decode
// lengths on the same GGUF through node-llama-cpp (prebuilt CPU binary), timings as one JSON line.
// usage: node bench_llama.mjs MODEL.gguf THREADS PROMPT GEN [REPS]
// REPS runs, each in a fresh context; the best of each phase is printed, as strata bench does.
// The package is imported from $STRATA_NLC/node_modules (npm install --prefix DIR
// node-llama-cpp@3.21.1), else resolved as usual. Prompt ids follow strata bench's rule
// ((i * 7919 + 13) % n_vocab), so both sides route the same tokens.
import {pathToFileURL} from "node:url";
import {resolve} from "node:path";

const [model_path, threads_s, prompt_s, gen_s, reps_s] = process.argv.slice(2);
const threads = Number(threads_s), n_prompt = Number(prompt_s), n_gen = Number(gen_s);
const reps = Math.max(1, Number(reps_s ?? 1));
const where = process.env.STRATA_NLC
    ? pathToFileURL(resolve(process.env.STRATA_NLC, "node_modules/node-llama-cpp/dist/index.js")).href
    : "node-llama-cpp";
const {getLlama, LlamaLogLevel} = await import(where);

// llama.cpp's own timings (llama_perf_context_print) arrive through the logger
const perf = [];
const llama = await getLlama({
    gpu: false, build: "never", logLevel: LlamaLogLevel.info,
    logger: (level, message) => { if (/eval time/.test(message)) perf.push(message); if (process.env.BENCH_DEBUG) console.error(message); },
});
const model = await llama.loadModel({modelPath: model_path, gpuLayers: 0});
const vocab = model.tokens?.length ?? model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length;
const ctx_opts = {
    contextSize: n_prompt + n_gen + 64, batchSize: Math.min(512, n_prompt), threads,
    performanceTracking: true,
};
const ids = Array.from({length: n_prompt}, (_, i) => (i * 7919 + 13) % vocab);

// warm-up, as llama-bench's and strata bench's: the whole prompt once in the context the reps
// use, so the weights are paged in and its compute buffers and KV cache are faulted in before
// the clock starts; printTimings resets llama.cpp's counters, and the warm-up's are dropped
const ctx = await model.createContext(ctx_opts);
const seq = ctx.getSequence();
for await (const t of seq.evaluate(ids, {temperature: 0})) break;
await ctx.printTimings();
perf.length = 0;
const now = () => Number(process.hrtime.bigint()) / 1e9;
const ms = (re) => {
    for (const l of perf) { const m = re.exec(l); if (m) return [Number(m[1]), Number(m[2])]; }
    return [NaN, NaN];
};
const best = {prefill_tok_s: 0, decode_tok_s: 0, wall_prefill_tok_s: 0, wall_decode_tok_s: 0};
let gen = 0;
for (let rep = 0; rep < reps; rep++) {
    await seq.clearHistory();
    const t0 = now();
    let t1 = 0, got = 0;
    for await (const t of seq.evaluate(ids, {temperature: 0})) {
        if (got === 0) t1 = now();
        if (++got > n_gen) break;
    }
    const t2 = now();
    perf.length = 0;
    await ctx.printTimings();
    // "prompt eval time = X ms / N tokens", "eval time = Y ms / M runs": llama.cpp's compute
    const [p_ms, p_n] = ms(/prompt eval time\s*=\s*([\d.]+) ms \/\s*(\d+)/);
    const [e_ms, e_n] = ms(/(?:^|:)\s*eval time\s*=\s*([\d.]+) ms \/\s*(\d+)/);
    // wall clock: the first token's time is the prompt plus one sampling, the rest decode steps
    const r = {
        prefill_tok_s: p_n / (p_ms / 1e3), decode_tok_s: e_n / (e_ms / 1e3),
        wall_prefill_tok_s: n_prompt / (t1 - t0), wall_decode_tok_s: (got - 1) / (t2 - t1),
    };
    for (const k of Object.keys(best)) best[k] = Math.max(best[k], r[k]);
    gen = got - 1;
}
await ctx.dispose();
console.log(JSON.stringify({
    engine: "llama.cpp (node-llama-cpp 3.21.1)", threads, prompt: n_prompt, gen, reps, ...best,
}));
await model.dispose();
