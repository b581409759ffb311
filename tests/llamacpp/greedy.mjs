// greedy.mjs — llama.cpp's greedy continuation of a prompt given as token ids, through
// node-llama-cpp's prebuilt CPU binary: `node greedy.mjs MODEL.gguf IDS N` prints one JSON line
// {"model", "prompt_ids", "ids"} with N generated ids.
// The prompt goes in as ids (no tokenizer, no BOS added), sampling is temperature 0 with every
// penalty off, and end-of-generation tokens are kept, so the N ids are exactly N argmax steps of
// llama.cpp's logits; run.sh feeds them to `strata run --teacher`.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [model_path, ids_arg, n_arg] = process.argv.slice(2);
const n = Number(n_arg);
const prompt = (ids_arg ?? "").split(",").map(Number);
if (!model_path || !Number.isInteger(n) || n < 1 || prompt.some((t) => !Number.isInteger(t) || t < 0)) {
    console.error("usage: node greedy.mjs MODEL.gguf ID,ID,... N (N >= 1 tokens to generate)");
    process.exit(2);
}

// build "never": use the npm package's prebuilt binary, never compile llama.cpp in CI.
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: model_path});
// One thread: llama.cpp's workers spin while they wait, and on a busy 2-core CI machine two of them
// took 400 ms a token on a 2 MB model against 3 ms for one.
const ctx = await model.createContext({contextSize: prompt.length + n + 16, threads: 1});
const seq = ctx.getSequence();
const ids = [];
for await (const t of seq.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
    ids.push(t);
    if (ids.length === n) break;
}
await ctx.dispose();
await model.dispose();
await llama.dispose();
if (ids.length !== n) {
    console.error(`greedy.mjs: ${model_path}: llama.cpp stopped after ${ids.length} of ${n} tokens`);
    process.exit(1);
}
console.log(JSON.stringify({model: model_path, prompt_ids: prompt, ids}));
