/* log — leveled logging to stderr, shared by every process.
 *
 * The level comes from strata_log_set_level() or, at first use, the STRATA_LOG environment variable
 * (error, warn, info, debug, trace; default info). Lines carry a time stamp and the process tag set by
 * strata_log_set_tag() (e.g. "arena"). Thread-safe: each line is written with one fprintf.
 */
#ifndef STRATA_LOG_H
#define STRATA_LOG_H

enum strata_log_level {
    STRATA_LOG_ERROR = 0,
    STRATA_LOG_WARN,
    STRATA_LOG_INFO,
    STRATA_LOG_DEBUG,
    STRATA_LOG_TRACE,
};

void strata_log_set_level(enum strata_log_level level);
enum strata_log_level strata_log_level(void);
/* strata_log_parse_level parses a level name; returns STRATA_EINVAL for an unknown name. */
int strata_log_parse_level(const char *name, enum strata_log_level *out);
void strata_log_set_tag(const char *tag);
void strata_log(enum strata_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) strata_log(STRATA_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...)  strata_log(STRATA_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...)  strata_log(STRATA_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...)                                                                             \
    do {                                                                                           \
        if (strata_log_level() >= STRATA_LOG_DEBUG) strata_log(STRATA_LOG_DEBUG, __VA_ARGS__);     \
    } while (0)

#endif
