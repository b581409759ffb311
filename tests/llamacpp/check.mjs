// check.mjs — the verdict of the llama.cpp parity stage: `node check.mjs DIR ARCH:TYPE...` reads
// DIR/ARCH-TYPE.llama.json (greedy.mjs: llama.cpp's greedy ids) and DIR/ARCH-TYPE.strata.json
// (`strata run --teacher` on those ids), prints one table row per model and exits 1 if any fails.
//
// A step passes when llama.cpp's token is strata's argmax, or when strata's top logit exceeds the
// token's logit by at most EPS x (top - min logit) of that step. Tolerances, from measurements on the
// tiny fixtures (logit ranges ~85-105; 6 prompts x 32 steps x 4 archs per type):
// - f32: 1e-3. Both sides compute in floats (llama.cpp keeps K/V in f16); all 768 greedy tokens
//   were strata's argmax and the two agreed on the gaps between llama.cpp's top 3 to 1.5e-4 of the
//   range.
// - quantized types: 5e-2. Both sides quantize activations to Q8_0/Q8_K as ggml does, but float
//   differences upstream (summation order, the f16 cache) flip roundings of single elements, which
//   moves logits by 0.1-0.6 (<= 7e-3 of the range) at every step; isolated single steps move by
//   up to 3.4 logits (the neighbours stay within 0.4, as when the perturbation flips which experts
//   the token is routed to; with the weights dequantized to f32 both agree again). Largest gaps
//   found: 3.2e-2 of the range (llama q4_k), 2.0e-2 (q4_k_m), 4.0e-3 (q8_0). Strata's argmax must
//   also be llama.cpp's token on at least 3/4 of the steps (measured: 28 of 32 at worst, 2259 of
//   2304 in all), so a wrong model cannot pass on the loose tolerance alone.
import {readFileSync} from "node:fs";

const EPS_F32 = 1e-3, EPS_QUANT = 5e-2, MIN_EXACT_SHARE = 0.75;

const [dir, ...models] = process.argv.slice(2);
if (!dir || !models.length) {
    console.error("usage: node check.mjs DIR ARCH:TYPE ...");
    process.exit(2);
}

const rows = [];
let failed = 0;
for (const m of models) {
    const [arch, type] = m.split(":");
    const base = `${dir}/${arch}-${type}`;
    const llama = JSON.parse(readFileSync(`${base}.llama.json`, "utf8"));
    const strata = JSON.parse(readFileSync(`${base}.strata.json`, "utf8"));
    const eps = type.startsWith("f32") ? EPS_F32 : EPS_QUANT; /* f32_old: deepseek2's attn_kv_b */
    const why = [];
    if (JSON.stringify(llama.ids) !== JSON.stringify(strata.teacher_ids) ||
        JSON.stringify(llama.prompt_ids) !== JSON.stringify(strata.prompt_ids))
        why.push("strata scored other ids than llama.cpp generated");
    let exact = 0, gap = 0, rel = 0, worst = -1;
    strata.steps.forEach((s, i) => {
        const g = s.top_logit - s.logit, r = g / (s.top_logit - s.min_logit);
        if (s.id === s.argmax) exact++;
        else if (!(r <= eps)) why.push(`step ${i}: token ${s.id} is ${g.toFixed(3)} below the top (${s.argmax})`);
        if (g > gap) [gap, rel, worst] = [g, r, i];
    });
    const n = strata.steps.length;
    if (exact < MIN_EXACT_SHARE * n) why.push(`strata's argmax is llama.cpp's token on ${exact} of ${n} steps`);
    if (why.length) failed++;
    rows.push([arch, type, n, `${exact}/${n}`, gap.toFixed(4), rel.toExponential(2),
               worst < 0 ? "-" : String(worst), eps.toExponential(0), why.length ? "FAIL" : "ok"]);
    for (const w of why) console.error(`${arch} ${type}: ${w}`);
}

const head = ["arch", "type", "steps", "exact", "max gap", "gap/range", "at step", "eps", ""];
const width = head.map((h, c) => Math.max(h.length, ...rows.map((r) => String(r[c]).length)));
for (const r of [head, ...rows]) console.log(r.map((v, c) => String(v).padEnd(width[c])).join("  ").trimEnd());
console.log(`llama.cpp parity: ${models.length - failed} of ${models.length} models pass`);
process.exit(failed ? 1 : 0);
