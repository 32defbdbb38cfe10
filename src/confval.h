/*
 * confval.h -- the one parser for configuration values (not installed).
 *
 * Every place that turns a configuration string into a value (the property
 * table in conf.c, the INI loader of the kinbox command, the relay) calls
 * these, so "TRUE", "On" and "1" mean the same everywhere and a typo is an
 * error naming the key and the value instead of a silent default.
 *
 * All functions are pure: thread-safe, no allocation, no global state.
 * On failure they write a message naming `key` and the offending value into
 * errstr (NULL-safe, truncated to errstr_size) and leave *out unchanged.
 */
#ifndef KINBOX_CONFVAL_H
#define KINBOX_CONFVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/**
 * @brief Parse a boolean: true/false, yes/no, on/off, 1/0, in any letter
 *        case, without surrounding blanks.
 * @param key   Configuration key, used only in the error message.
 * @param value The text to parse (NULL is an error).
 * @param out   Receives the value on success.
 * @returns 0 on success, -1 (errstr filled) on anything else.
 */
int kinbox__confval_bool(const char *key, const char *value, bool *out,
                         char *errstr, size_t errstr_size);

/**
 * @brief Parse a base-10 integer in [min, max]: optional '-', digits, nothing
 *        else (no blanks, no suffix, no empty string).
 * @returns 0 on success, -1 (errstr names key, value and the range) on
 *          failure or when the value is out of range.
 */
int kinbox__confval_int(const char *key, const char *value, int64_t min,
                        int64_t max, int64_t *out, char *errstr,
                        size_t errstr_size);

/**
 * @brief A duration in ms as text in its largest whole unit ("14d",
 *        "36h", "90s", "500ms"; "0s" for 0), as the configuration writes
 *        it; into buf, returned.
 */
const char *kinbox__confval_duration_text(int64_t ms, char *buf, size_t sz);

/**
 * @brief Parse a duration into milliseconds: digits followed by one of the
 *        units ms, s, m, h, d (a bare number means seconds), e.g. 500ms,
 *        10s, 5m, 2h, 14d. Checked against [min_ms, max_ms].
 * @returns 0 on success, -1 (errstr names key and value) on malformed input,
 *          overflow or a value out of range.
 */
int kinbox__confval_duration(const char *key, const char *value,
                             int64_t min_ms, int64_t max_ms, int64_t *out,
                             char *errstr, size_t errstr_size);

/**
 * @brief Check a comma-separated list of Kafka topic names (blanks around
 *        each name and empty items are ignored, as the consumer does):
 *        each 1 to 249 characters of a-z A-Z 0-9 . _ -, and not "." or
 *        ".." (Kafka's rule: a broker never has another name, so a
 *        consumer of one would wait for it forever).
 * @returns 0 when every name is legal, -1 (errstr names key and the first
 *          illegal name) otherwise.
 */
int kinbox__confval_topics(const char *key, const char *value, char *errstr,
                           size_t errstr_size);

/**
 * @brief Write a duration in milliseconds the way a person would type it
 *        (the largest unit that divides it exactly: "14d", "90s", "250ms").
 * @param buf Receives a NUL-terminated string (truncated to size).
 * @returns buf.
 */
const char *kinbox__confval_duration_str(int64_t ms, char *buf, size_t size);

#endif
