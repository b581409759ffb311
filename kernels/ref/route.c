#include "kernels/ref/route.h"
#include "kernels/ref/ops.h"

#include <math.h>

void route_biased(const struct route_opts *o, float *p, float *s, uint32_t *sel, float *w)
{
    const uint32_t E = o->n_expert;
    if (o->softmax) {
        ops_softmax(p, E);
    } else {
        for (uint32_t e = 0; e < E; e++)
            p[e] = 1.0f / (1.0f + expf(-p[e]));
    }
    for (uint32_t e = 0; e < E; e++)
        s[e] = o->bias ? p[e] + o->bias[e] : p[e];
    if (o->n_group > 1 && o->n_group_used < o->n_group) {
        const uint32_t G = o->n_group, per = E / G;
        float score[64];
        uint32_t keep[64];
        for (uint32_t g = 0; g < G; g++) {
            /* the group's two largest s (one when a group has a single expert) */
            float a = -INFINITY, b = -INFINITY;
            for (uint32_t i = 0; i < per; i++) {
                const float v = s[g * per + i];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            score[g] = per > 1 ? a + b : a;
        }
        ops_topk(score, G, o->n_group_used, keep);
        for (uint32_t g = 0; g < G; g++) {
            bool kept = false;
            for (uint32_t j = 0; j < o->n_group_used; j++)
                kept |= keep[j] == g;
            for (uint32_t i = 0; !kept && i < per; i++)
                s[g * per + i] = -INFINITY;
        }
    }
    ops_topk(s, E, o->k, sel);
    float sum = 0.0f;
    for (uint32_t i = 0; i < o->k; i++)
        sum += w[i] = p[sel[i]];
    for (uint32_t i = 0; i < o->k; i++) {
        if (o->norm) w[i] /= sum;
        w[i] *= o->scale;
    }
}
