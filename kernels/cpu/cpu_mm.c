#include "kernels/cpu/cpu_mm.h"
#include "common/base/pool.h"
#include "kernels/cpu/cpu.h"

/* Weight rows per work item: whole 8-row kernel groups, at least MM_ROWS_MIN so a claim amortizes
 * the prefetch ramp at its start, and about MM_ITEMS_PER_THREAD items per thread on a big matrix
 * so a thread slowed by a busy core is made up for by the others. */
#define MM_ROWS_MIN         32
#define MM_ITEMS_PER_THREAD 16

struct mm_run {
    const struct cpu_mm_task *t;
    const uint32_t *first; /* first item of each task, then the total */
    uint32_t rows;         /* rows per item */
};

static void mm_items(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct mm_run *r = ctx;
    uint32_t k = 0;
    for (uint32_t item = lo; item < hi; item++) {
        while (r->first[k + 1] <= item)
            k++;
        const struct cpu_mm_task *t = &r->t[k];
        const uint32_t r0 = (item - r->first[k]) * r->rows;
        const uint32_t r1 = t->n_out - r0 < r->rows ? t->n_out : r0 + r->rows;
        cpu_matmul(t->type, t->w, t->row_bytes, t->n_in, r0, r1, t->acts, t->act_stride, t->n_tok,
                   t->out, t->out_stride);
    }
}

uint64_t cpu_mm_run(struct pool *pool, const struct cpu_mm_task *tasks, uint32_t n, uint32_t *first)
{
    uint64_t total = 0, bytes = 0;
    for (uint32_t k = 0; k < n; k++)
        total += tasks[k].n_out;
    uint64_t rows = total / ((uint64_t)pool_threads(pool) * MM_ITEMS_PER_THREAD);
    rows = rows < MM_ROWS_MIN ? MM_ROWS_MIN : (rows + 7) / 8 * 8;
    first[0] = 0;
    for (uint32_t k = 0; k < n; k++) {
        first[k + 1] = first[k] + (uint32_t)((tasks[k].n_out + rows - 1) / rows);
        bytes += tasks[k].row_bytes * tasks[k].n_out;
    }
    struct mm_run r = {tasks, first, (uint32_t)rows};
    pool_for(pool, first[n], 1, mm_items, &r);
    return bytes;
}
