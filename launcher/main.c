/* strata — the one command a user types: `strata <command> [args]`, as git. */
#include "launcher/cmd.h"
#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

#define STRATA_CMD(n) extern const struct strata_cmd strata_cmd_##n;
#include "strata_cmds.inc"
#undef STRATA_CMD

static const struct strata_cmd *const cmds[] = {
#define STRATA_CMD(n) &strata_cmd_##n,
#include "strata_cmds.inc"
#undef STRATA_CMD
    NULL,
};
static const size_t n_cmds = sizeof cmds / sizeof cmds[0] - 1;

static void usage(FILE *out)
{
    fprintf(out, "usage: strata <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < n_cmds; i++) fprintf(out, "  %-14s %s\n", cmds[i]->name, cmds[i]->summary);
    fprintf(out, "\n'strata <command> --help' explains a command; 'strata --version' prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) {
        printf("strata %s\n", STRATA_VERSION);
        return 0;
    }
    if (strcmp(name, "help") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        if (argc > 2 && strcmp(name, "help") == 0) {
            for (size_t i = 0; i < n_cmds; i++) {
                if (strcmp(cmds[i]->name, argv[2]) == 0) {
                    char *a[] = {argv[2], "--help", NULL};
                    return cmds[i]->run(2, a);
                }
            }
        }
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < n_cmds; i++)
        if (strcmp(cmds[i]->name, name) == 0) return cmds[i]->run(argc - 1, argv + 1);
    fprintf(stderr, "strata: '%s' is not a strata command; see 'strata help'\n", name);
    return 2;
}
