/*
 * One field of one line of flat JSON (the JSON Lines the lower-bound tool
 * writes, tests/data/lower_bound_results.jsonl): a number, or a string
 * copied into str. Enough for those files, not a JSON parser.
 */
#ifndef CAP_JSON_FIELD_H
#define CAP_JSON_FIELD_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of "key" in line: a string into str (NUL-terminated, at most
 * str_len - 1 bytes), or a number into *num (null and NaN read as NAN).
 * False when absent or not of the kind asked for. */
static inline bool cap_json_field(const char *line, const char *key,
                                  double *num, char *str, size_t str_len) {
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (!p)
    return false;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  if (*p == '"') {
    const char *e = strchr(++p, '"');
    if (!e || !str || (size_t)(e - p) >= str_len)
      return false;
    memcpy(str, p, (size_t)(e - p));
    str[e - p] = '\0';
    return true;
  }
  if (!num)
    return false;
  if (!strncmp(p, "null", 4) || !strncmp(p, "NaN", 3)) {
    *num = NAN;
    return true;
  }
  char *end;
  *num = strtod(p, &end);
  return end != p;
}

#endif /* CAP_JSON_FIELD_H */
