/* cmd — the `strata` umbrella command's subcommand contract, as git's builtins.
 *
 * Each subcommand lives in launcher/cmd_NAME.c and defines
 *     const struct strata_cmd strata_cmd_NAME = {"name", "one-line summary", run};
 * The build collects them (CMake globs cmd_*.c into strata_cmds.inc); nothing else to register.
 * run() gets argv with argv[0] = the subcommand name and returns the process exit status
 * (0 success, 1 failure, 2 usage error). It prints its own errors.
 */
#ifndef STRATA_CMD_H
#define STRATA_CMD_H

#include <stdint.h>

struct strata_cmd {
    const char *name;    /* as typed: "gguf", "bpe-train" */
    const char *summary; /* for `strata help` */
    int (*run)(int argc, char **argv);
};

/* strata_cmd_fail prints "strata NAME: <what>: <strerror>[: <detail>]" for error code rv and
 * returns 1, the exit status for a failure. */
int strata_cmd_fail(const char *name, const char *what, int rv);

/* strata_cmd_parse_u32 reads option OPT's value S, a whole decimal number from MIN to UINT32_MAX,
 * into *out. STRATA_EINVAL (detail naming OPT and S) for anything else, *out then untouched. */
int strata_cmd_parse_u32(const char *s, const char *opt, uint32_t min, uint32_t *out);

#endif
