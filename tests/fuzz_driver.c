/* fuzz_driver — runs a libFuzzer target without libFuzzer (gcc builds, CI): every file of the
 * corpus directories given, then -runs=N inputs made by seeded mutations of them (-seed=S), so the
 * same binary and arguments always test the same inputs. Crashes abort as under libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct input {
    uint8_t *p;
    size_t n;
};

static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void load_dir(const char *dir, struct input **v, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        if (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) len = 0;
        fclose(f);
        *v = realloc(*v, (*n + 1) * sizeof **v);
        (*v)[(*n)++] = (struct input){buf, (size_t)(len > 0 ? len : 0)};
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    long runs = 1000;
    rng_state = 1;
    struct input *v = NULL;
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "-runs=", 6) == 0)
            runs = atol(argv[i] + 6);
        else if (strncmp(argv[i], "-seed=", 6) == 0)
            rng_state = strtoull(argv[i] + 6, NULL, 10);
        else if (argv[i][0] != '-')
            load_dir(argv[i], &v, &n);
    }
    for (size_t i = 0; i < n; i++) LLVMFuzzerTestOneInput(v[i].p, v[i].n);
    uint8_t *buf = malloc(1 << 16);
    for (long r = 0; r < runs; r++) {
        size_t len = 0;
        if (n > 0) {
            struct input *in = &v[rnd() % n];
            len = in->n < (1 << 16) ? in->n : (1 << 16);
            memcpy(buf, in->p, len);
        } else {
            len = rnd() % 256;
            for (size_t k = 0; k < len; k++) buf[k] = (uint8_t)rnd();
        }
        int edits = 1 + (int)(rnd() % 8);
        for (int k = 0; k < edits; k++) {
            switch (rnd() % 4) {
            case 0: /* flip a byte */
                if (len) buf[rnd() % len] ^= (uint8_t)(1 + rnd() % 255);
                break;
            case 1: /* truncate */
                if (len) len = rnd() % len;
                break;
            case 2: /* an interesting value */
                if (len >= 8) {
                    static const uint64_t vals[] = {0, 1, 0xff, 0x7fffffff, 0xffffffff,
                                                    0xffffffffffffffffull, 0x8000000000000000ull};
                    uint64_t x = vals[rnd() % 7];
                    memcpy(buf + rnd() % (len - 7), &x, 8);
                }
                break;
            case 3: /* append random bytes */
                for (int j = 0; j < 16 && len < (1 << 16); j++) buf[len++] = (uint8_t)rnd();
                break;
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("fuzz: %zu corpus inputs, %ld mutations: no crash\n", n, runs);
    free(buf);
    for (size_t i = 0; i < n; i++) free(v[i].p);
    free(v);
    return 0;
}
