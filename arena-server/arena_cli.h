/* arena_cli — the strata-arena subcommands that are not `serve`: inspect, verify, bench, status,
 * stop. Each takes argv with argv[0] = the subcommand name, prints its own errors and returns the
 * process exit status (0 success, 1 failure, 2 usage). inspect and verify read the segments
 * directly and need no server; status and stop talk to the server's control socket.
 */
#ifndef STRATA_ARENA_CLI_H
#define STRATA_ARENA_CLI_H

#include <stdint.h>

/* arena_cli_inspect: `inspect NAME [--shm-dir DIR] [--json]` — the layout, blob by blob. */
int arena_cli_inspect(int argc, char **argv);

/* arena_cli_verify: `verify NAME [--shm-dir DIR]` — every byte against the GGUF, every hash. */
int arena_cli_verify(int argc, char **argv);

/* arena_cli_bench: `bench MODEL.gguf [--shm-dir DIR] [--threads N] [--align 4k|2m]` — cold and
 * warm build rate against a sequential read of the file. */
int arena_cli_bench(int argc, char **argv);

/* arena_cli_status: `status NAME [--runtime-dir DIR]` — the server's answer to "status". */
int arena_cli_status(int argc, char **argv);

/* arena_cli_stop: `stop NAME [--runtime-dir DIR] [--force]` — shutdown, then wait for the exit. */
int arena_cli_stop(int argc, char **argv);

/* arena_cli_parse_align parses "4k", "2m" or a byte count (a power of two >= 4096). */
int arena_cli_parse_align(const char *s, uint64_t *out);

#endif
