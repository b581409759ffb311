#include "kernels/ref/ops.h"
#include "common/quant/quant.h"
#include "kernels/ref/qdot.h"

#include <math.h>

void ops_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double sum = 0.0; /* double, as ggml's rms_norm: float sums drift on wide rows */
    for (uint32_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (uint32_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void ops_rope(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
              float theta, bool neox)
{
    const float theta_scale = powf(theta, -2.0f / (float)n_rot);
    const uint32_t half = n_rot / 2;
    for (uint32_t h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        float t = (float)pos;
        for (uint32_t i = 0; i < half; i++) {
            const float c = cosf(t), s = sinf(t);
            const uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
            t *= theta_scale;
        }
    }
}

void ops_yarn_init(struct ops_yarn *y, uint32_t n_rot, uint32_t n_ctx_orig, float theta,
                   float factor)
{
    *y = (struct ops_yarn){1.0f, 0.0f, 1.0f, {0.0f, 0.0f}};
    if (!(factor > 1.0f)) return;
    y->freq_scale = 1.0f / factor;
    y->ext_factor = 1.0f;
    y->mscale = 1.0f + 0.1f * logf(1.0f / y->freq_scale);
    /* the pair index at which a rotation completes n_ctx_orig / (2 pi beta) turns */
    const float beta_fast = 32.0f, beta_slow = 1.0f;
    const float lo = (float)n_rot * logf((float)n_ctx_orig / (beta_fast * 2 * (float)M_PI)) /
                     (2 * logf(theta));
    const float hi = (float)n_rot * logf((float)n_ctx_orig / (beta_slow * 2 * (float)M_PI)) /
                     (2 * logf(theta));
    y->corr[0] = fmaxf(0.0f, floorf(lo));
    y->corr[1] = fminf((float)n_rot - 1, ceilf(hi));
}

void ops_yarn_angle(const struct ops_yarn *y, float t, uint32_t i, float *c, float *s)
{
    float a = y->freq_scale * t;
    if (y->ext_factor != 0.0f) {
        const float r = ((float)i - y->corr[0]) / fmaxf(0.001f, y->corr[1] - y->corr[0]);
        const float mix = (1 - fminf(1, fmaxf(0, r))) * y->ext_factor;
        a = a * (1 - mix) + t * mix;
    }
    *c = cosf(a) * y->mscale;
    *s = sinf(a) * y->mscale;
}

void ops_rope_yarn(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *y)
{
    const float theta_scale = powf(theta, -2.0f / (float)n_rot);
    const uint32_t half = n_rot / 2;
    for (uint32_t h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        float t = (float)pos;
        for (uint32_t i = 0; i < half; i++) {
            float c, s;
            ops_yarn_angle(y, t, i, &c, &s);
            const uint32_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
            const float x0 = v[ia], x1 = v[ib];
            v[ia] = x0 * c - x1 * s;
            v[ib] = x0 * s + x1 * c;
            t *= theta_scale;
        }
    }
}

void ops_softmax(float *x, uint32_t n)
{
    float max = -INFINITY;
    for (uint32_t i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++) x[i] *= inv;
}

void ops_topk(const float *x, uint32_t n, uint32_t k, uint32_t *idx)
{
    /* O(n*k) selection: k <= 8 and n <= a few hundred experts; a sort would cost more. */
    for (uint32_t j = 0; j < k; j++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < n; i++) {
            bool taken = false;
            for (uint32_t p = 0; p < j && !taken; p++) taken = idx[p] == i;
            if (taken) continue;
            if (best == UINT32_MAX || x[i] > x[best]) best = i;
        }
        idx[j] = best;
    }
}

#define ARGMAX_LANES 8

uint32_t ops_argmax(const float *x, uint32_t n)
{
    /* The largest value in ARGMAX_LANES running maxima, then the first index that holds it: a
     * greedy pick reads the whole vocabulary each step (0.6 MB for Qwen3's), and the scan's one
     * chain of compare, move and load took 2.6% of a decode step (Zen 4, 2 threads). Comparisons
     * with a NaN are false, so NaNs drop out of both passes as they do out of the scan. */
    if (n == 0 || isnan(x[0])) return 0;
    float m[ARGMAX_LANES];
    for (int k = 0; k < ARGMAX_LANES; k++)
        m[k] = x[0];
    uint32_t i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES) {
        /* unrolled, the maxima stay in registers: 8 chains, not the scan's one through a load */
#pragma GCC unroll 8
        for (int k = 0; k < ARGMAX_LANES; k++)
            m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    }
    float best = m[0];
    for (int k = 1; k < ARGMAX_LANES; k++)
        best = m[k] > best ? m[k] : best;
    for (; i < n; i++)
        best = x[i] > best ? x[i] : best;
    for (i = 0; i < n; i++)
        if (x[i] == best) break;
    return i;
}

float ops_silu(float x)
{
    return x / (1.0f + expf(-x));
}

void ops_swiglu(float *out, const float *gate, const float *up, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) out[i] = ops_silu(gate[i]) * up[i];
}

void ops_swiglu_oai(float *out, const float *gate, const float *up, uint32_t n, float alpha,
                    float limit)
{
    for (uint32_t i = 0; i < n; i++) {
        const float g = fminf(gate[i], limit), u = fmaxf(fminf(up[i], limit), -limit);
        out[i] = g / (1.0f + expf(alpha * -g)) * (u + 1.0f);
    }
}

int ops_quantize_acts(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                      uint32_t n_tok, void *dst, size_t act_stride)
{
    for (uint32_t t = 0; t < n_tok; t++) {
        int rv = quant_activations(wtype, x + t * x_stride, (uint8_t *)dst + t * act_stride, n_in);
        if (rv) return rv;
    }
    return 0;
}

void ops_matmul(uint32_t wtype, const void *w, uint64_t row_bytes, uint32_t n_in, uint32_t row0,
                uint32_t row1, const void *acts, size_t act_stride, uint32_t n_tok, float *out,
                size_t out_stride)
{
    /* Rows outer, tokens inner: a weight row is read once per call while it is in cache. */
    for (uint32_t r = row0; r < row1; r++) {
        const uint8_t *wr = (const uint8_t *)w + r * row_bytes;
        for (uint32_t t = 0; t < n_tok; t++)
            out[t * out_stride + r] =
                qdot_ref(wtype, n_in, wr, (const uint8_t *)acts + t * act_stride);
    }
}

void ops_attention(float *out, const float *q, uint32_t head_dim, uint32_t head_dim_v, float scale,
                   const struct ops_kv_view *kv, uint32_t n_keys)
{
    ops_attention_ex(out, q, head_dim, head_dim_v, scale, kv, 0, n_keys, -INFINITY);
}

void ops_attention_sink(float *out, uint32_t head_dim_v, float *m, float *l, float sink)
{
    if (!(sink > -INFINITY)) return;
    /* the sink as a last key of score `sink` and no value: only the denominator grows */
    const float mn = sink > *m ? sink : *m;
    const float c = expf(*m - mn);
    *l *= c;
    for (uint32_t d = 0; d < head_dim_v; d++) out[d] *= c;
    *l += expf(sink - mn);
    *m = mn;
}

void ops_attention_ex(float *out, const float *q, uint32_t head_dim, uint32_t head_dim_v,
                      float scale, const struct ops_kv_view *kv, uint32_t key_lo, uint32_t n_keys,
                      float sink)
{
    float s[OPS_ATTN_BLOCK];
    const float *vrow[OPS_ATTN_BLOCK];
    float m = -INFINITY, l = 0.0f;
    const size_t kstep = kv->k_cols ? kv->block_tokens : 1; /* floats between a key's dims */
    for (uint32_t d = 0; d < head_dim_v; d++) out[d] = 0.0f;
    for (uint32_t j0 = key_lo / OPS_ATTN_BLOCK * OPS_ATTN_BLOCK; j0 < n_keys;
         j0 += OPS_ATTN_BLOCK) {
        const uint32_t nb = n_keys - j0 < OPS_ATTN_BLOCK ? n_keys - j0 : OPS_ATTN_BLOCK;
        float bm = -INFINITY;
        for (uint32_t j = 0; j < nb; j++) {
            const uint32_t key = j0 + j;
            const float *base = kv->blocks[key / kv->block_tokens];
            const uint32_t slot = key % kv->block_tokens;
            const float *k = base + ops_kv_k_at(kv, slot, 0);
            vrow[j] = base + kv->v_off + slot * kv->v_stride;
            if (key < key_lo) {
                s[j] = -INFINITY; /* outside the window: weight expf(-inf) = 0 */
                continue;
            }
            float dot = 0.0f;
            for (uint32_t d = 0; d < head_dim; d++)
                dot = fmaf(q[d], k[d * kstep], dot);
            s[j] = dot * scale;
            bm = s[j] > bm ? s[j] : bm;
        }
        const float mn = bm > m ? bm : m;
        const float c = expf(m - mn); /* 0 on the first block, where m is -inf */
        l *= c;
        for (uint32_t d = 0; d < head_dim_v; d++) out[d] *= c;
        for (uint32_t j = 0; j < nb; j++) {
            const float p = expf(s[j] - mn);
            l += p;
            for (uint32_t d = 0; d < head_dim_v; d++)
                out[d] = fmaf(p, vrow[j][d], out[d]);
        }
        m = mn;
    }
    ops_attention_sink(out, head_dim_v, &m, &l, sink);
    const float inv = 1.0f / l;
    for (uint32_t d = 0; d < head_dim_v; d++) out[d] *= inv;
}

void ops_kv_widen(struct ops_kv_view *v, uint32_t n_keys, uint32_t head_dim, uint32_t head_dim_v)
{
    if (!v->hblocks) return;
    const uint32_t bt = v->block_tokens, nb = (n_keys + bt - 1) / bt;
    const size_t blk = (size_t)bt * (head_dim + head_dim_v);
    for (uint32_t i = 0; i < nb; i++) {
        const uint16_t *src = v->hblocks[i];
        float *dst = v->conv + i * blk;
        const uint32_t rows = i + 1 < nb ? bt : n_keys - i * bt;
        if (v->k_cols) /* the columns are rows of bt halves: converted as they lie */
            quant_f16_to_f32_rows(src + v->k_off, dst, (size_t)head_dim * bt);
        for (uint32_t r = 0; r < rows; r++) {
            if (!v->k_cols)
                quant_f16_to_f32_rows(src + v->k_off + (size_t)r * v->k_stride,
                                      dst + (size_t)r * head_dim, head_dim);
            quant_f16_to_f32_rows(src + v->v_off + (size_t)r * v->v_stride,
                                  dst + (size_t)bt * head_dim + (size_t)r * head_dim_v, head_dim_v);
        }
        v->wtab[i] = dst;
    }
    v->blocks = v->wtab;
    v->hblocks = NULL;
    v->k_off = 0;
    v->v_off = (size_t)bt * head_dim;
    v->k_stride = v->k_cols ? 1 : head_dim;
    v->v_stride = head_dim_v;
}
