/* cpu — run-time choice of the kernel ISA and the dispatch of cpu.h's functions. */
#include "kernels/cpu/cpu.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/ref/expf_tab.h"
#include "kernels/ref/qdot.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Atomic int g_isa = CPU_REF;

int cpu_isa_supported(enum cpu_isa isa)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (isa) {
    case CPU_REF:
        return 1;
    case CPU_AVX2:
        return avx2;
    case CPU_AVX512:
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    return 0;
#else
    return isa == CPU_REF;
#endif
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    return isa == CPU_AVX512 ? "avx512" : isa == CPU_AVX2 ? "avx2" : "ref";
}

static void detect(void)
{
    enum cpu_isa best = cpu_isa_supported(CPU_AVX512) ? CPU_AVX512
                        : cpu_isa_supported(CPU_AVX2) ? CPU_AVX2
                                                      : CPU_REF;
    const char *env = getenv("STRATA_CPU");
    if (env && *env) {
        enum cpu_isa want = !strcmp(env, "avx512") ? CPU_AVX512
                            : !strcmp(env, "avx2") ? CPU_AVX2
                            : !strcmp(env, "ref")  ? CPU_REF
                                                   : best;
        if (want == best && strcmp(env, cpu_isa_name(best)))
            LOG_WARN("STRATA_CPU=%s is not one of ref, avx2, avx512: using %s", env,
                     cpu_isa_name(best));
        else if (!cpu_isa_supported(want))
            LOG_WARN("STRATA_CPU=%s: this CPU lacks it, using %s", env, cpu_isa_name(best));
        else
            best = want;
    }
    atomic_store(&g_isa, best);
}

enum cpu_isa cpu_isa(void)
{
    pthread_once(&g_once, detect);
    return (enum cpu_isa)atomic_load(&g_isa);
}

int cpu_isa_set(enum cpu_isa isa)
{
    pthread_once(&g_once, detect);
    if (!cpu_isa_supported(isa))
        return strata_errf(STRATA_EUNSUPPORTED, "this CPU cannot run the %s kernels: use %s",
                           cpu_isa_name(isa), cpu_isa_name(CPU_AVX2));
    atomic_store(&g_isa, isa);
    return 0;
}

void cpu_matmul(uint32_t wtype, const void *w, uint64_t row_bytes, uint32_t n_in, uint32_t row0,
                uint32_t row1, const void *acts, size_t act_stride, uint32_t n_tok, float *out,
                size_t out_stride)
{
    cpu_rows_fn fn = NULL;
    switch (cpu_isa()) {
    case CPU_AVX512:
        fn = cpu_rows_avx512(wtype);
        break;
    case CPU_AVX2:
        fn = cpu_rows_avx2(wtype);
        break;
    case CPU_REF:
        break;
    }
    if (!fn) {
        ops_matmul(wtype, w, row_bytes, n_in, row0, row1, acts, act_stride, n_tok, out, out_stride);
        return;
    }
    if (row0 < row1 && n_tok)
        fn(w, row_bytes, n_in, row0, row1, acts, act_stride, n_tok, out, out_stride);
}

/* 2^(i/32) as doubles: glibc's expf table, the vector expf's (vec_avx512.c, vec_avx2.c) */
_Alignas(64) const uint64_t cpu_exp_tab[32] = {STRATA_EXPF_TAB};

static pthread_once_t g_vexp_once = PTHREAD_ONCE_INIT, g_vexp2_once = PTHREAD_ONCE_INIT;
static int g_vexp_ok, g_vexp2_ok;

/* vexp_matches compares vector expf fn with libm's over [-110, 90] in steps of 2^11 float bit
 * patterns (every exponent and the main path's edges), plus -inf, inf, NaN and zeros. */
static int vexp_matches(void (*fn)(const float *, float *, uint32_t))
{
    enum { CHUNK = 4096 };
    static float x[CHUNK], y[CHUNK];
    uint32_t n = 0, bad = 0;
    const float special[] = {-INFINITY, INFINITY, NAN, 0.0f, -0.0f, -88.0f, 88.0f, -103.5f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[n++] = special[i];
    for (uint64_t sign = 0; sign < 2 && !bad; sign++)
        for (uint32_t bits = 0; !bad; bits += 1u << 11) {
            uint32_t u = bits | (uint32_t)sign << 31;
            float v;
            memcpy(&v, &u, 4);
            if (sign ? v < -110.0f : v > 90.0f) break;
            x[n++] = v;
            if (n == CHUNK) {
                fn(x, y, n);
                for (uint32_t i = 0; i < n; i++) {
                    const float e = expf(x[i]);
                    bad += memcmp(&e, &y[i], 4) != 0 && !(isnan(e) && isnan(y[i]));
                }
                n = 0;
            }
        }
    fn(x, y, n);
    for (uint32_t i = 0; i < n; i++) {
        const float e = expf(x[i]);
        bad += memcmp(&e, &y[i], 4) != 0 && !(isnan(e) && isnan(y[i]));
    }
    if (bad) LOG_INFO("this libm's expf is not glibc's table method: attention calls it per score");
    return bad == 0;
}

static void check_vexp(void)
{
    g_vexp_ok = vexp_matches(cpu_expf_avx512);
}

static void check_vexp2(void)
{
    g_vexp2_ok = vexp_matches(cpu_expf_avx2);
}

int cpu_vexp_ok(void)
{
    if (!cpu_isa_supported(CPU_AVX512)) return 0;
    pthread_once(&g_vexp_once, check_vexp);
    return g_vexp_ok;
}

int cpu_vexp2_ok(void)
{
    if (!cpu_isa_supported(CPU_AVX2)) return 0;
    pthread_once(&g_vexp2_once, check_vexp2);
    return g_vexp2_ok;
}

/* vexp_fn: the vector expf of the ISA in use where it is libm's, else NULL. */
typedef void (*vexp_fn)(const float *x, float *y, uint32_t n);

static vexp_fn vexp_in_use(void)
{
    switch (cpu_isa()) {
    case CPU_AVX512:
        return cpu_vexp_ok() ? cpu_expf_avx512 : NULL;
    case CPU_AVX2:
        return cpu_vexp2_ok() ? cpu_expf_avx2 : NULL;
    default:
        return NULL;
    }
}

#define GLU_CHUNK 256 /* elements whose exponentials are taken at once */

void cpu_swiglu(float *out, const float *gate, const float *up, uint32_t n)
{
    const vexp_fn vexp = vexp_in_use();
    if (!vexp) {
        ops_swiglu(out, gate, up, n);
        return;
    }
    float e[GLU_CHUNK];
    for (uint32_t i0 = 0; i0 < n; i0 += GLU_CHUNK) {
        const uint32_t m = n - i0 < GLU_CHUNK ? n - i0 : GLU_CHUNK;
        for (uint32_t i = 0; i < m; i++)
            e[i] = -gate[i0 + i];
        vexp(e, e, m);
        /* ops_silu(g) * u: g / (1 + expf(-g)) * u */
        for (uint32_t i = 0; i < m; i++)
            out[i0 + i] = gate[i0 + i] / (1.0f + e[i]) * up[i0 + i];
    }
}

void cpu_swiglu_oai(float *out, const float *gate, const float *up, uint32_t n, float alpha,
                    float limit)
{
    const vexp_fn vexp = vexp_in_use();
    if (!vexp) {
        ops_swiglu_oai(out, gate, up, n, alpha, limit);
        return;
    }
    float e[GLU_CHUNK];
    for (uint32_t i0 = 0; i0 < n; i0 += GLU_CHUNK) {
        const uint32_t m = n - i0 < GLU_CHUNK ? n - i0 : GLU_CHUNK;
        for (uint32_t i = 0; i < m; i++)
            e[i] = alpha * -fminf(gate[i0 + i], limit);
        vexp(e, e, m);
        for (uint32_t i = 0; i < m; i++) {
            const float g = fminf(gate[i0 + i], limit), u = fmaxf(fminf(up[i0 + i], limit), -limit);
            out[i0 + i] = g / (1.0f + e[i]) * (u + 1.0f);
        }
    }
}

int cpu_quantize_acts(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                      uint32_t n_tok, void *dst, size_t act_stride)
{
    if (cpu_isa() == CPU_AVX512)
        return cpu_quantize_acts_avx512(wtype, x, x_stride, n_in, n_tok, dst, act_stride);
    return ops_quantize_acts(wtype, x, x_stride, n_in, n_tok, dst, act_stride);
}

float cpu_qdot(uint32_t wtype, int64_t n, const void *w_row, const void *act)
{
    if (cpu_isa() == CPU_REF || n <= 0 || n > UINT32_MAX) return qdot_ref(wtype, n, w_row, act);
    float out = 0.0f;
    cpu_matmul(wtype, w_row, 0, (uint32_t)n, 0, 1, act, 0, 1, &out, 1);
    return out;
}

void cpu_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    if (cpu_isa() == CPU_REF)
        ops_rmsnorm(out, x, w, n, eps);
    else
        cpu_rmsnorm_avx2(out, x, w, n, eps);
}

void cpu_rope(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
              float theta, bool neox)
{
    if (cpu_isa() == CPU_REF)
        ops_rope(x, n_head, head_dim, n_rot, pos, theta, neox);
    else
        cpu_rope_avx2(x, n_head, head_dim, n_rot, pos, theta, neox, NULL);
}

void cpu_rope_yarn(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *y)
{
    if (cpu_isa() == CPU_REF)
        ops_rope_yarn(x, n_head, head_dim, n_rot, pos, theta, neox, y);
    else
        cpu_rope_avx2(x, n_head, head_dim, n_rot, pos, theta, neox, y);
}

void cpu_attention(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v, float scale,
                   const struct ops_kv_view *kv)
{
    const enum cpu_isa isa = cpu_isa();
    if (isa != CPU_REF && head_dim <= CPU_ATT_MAXD && a->n_tok * a->n_head <= CPU_ATT_MAXQ) {
        if (isa == CPU_AVX512)
            cpu_attention_avx512(a, head_dim, head_dim_v, scale, kv, cpu_vexp_ok());
        else
            cpu_attention_avx2(a, head_dim, head_dim_v, scale, kv, cpu_vexp2_ok());
        return;
    }
    /* the reference reads floats: an fp16 view is widened first (into its own scratch) */
    struct ops_kv_view w = *kv;
    ops_kv_widen(&w, a->n_keys0 + a->n_tok - 1, head_dim, head_dim_v);
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const uint32_t n = a->n_keys0 + t, lo = cpu_att_lo(a, t);
        for (uint32_t h = 0; h < a->n_head; h++)
            ops_attention_ex(a->out + t * a->out_tok + h * a->out_head,
                             a->q + t * a->q_tok + h * a->q_head, head_dim, head_dim_v, scale, &w,
                             lo, n, a->sinks ? a->sinks[h] : -INFINITY);
    }
}
