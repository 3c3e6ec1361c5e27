/*
 * Leveled log lines: "2026-11-23T02:40:00.123Z capuchind[42] info: ...".
 * stderr by default; a log file (config "log-file") is reopened on SIGHUP so
 * that logrotate can move it away.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "daemon_internal.h"

static cap_log_level_t log_level = CAP_LOG_INFO;
static FILE *log_file; /* NULL: stderr */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void cap__log_set_level(cap_log_level_t level) { log_level = level; }
cap_log_level_t cap__log_get_level(void) { return log_level; }

int cap__log_parse_level(const char *s, cap_log_level_t *out) {
  for (int i = 0; i <= CAP_LOG_DEBUG; i++) {
    if (strcasecmp(s, level_names[i]) == 0) {
      *out = (cap_log_level_t)i;
      return 0;
    }
  }
  if (strcasecmp(s, "warning") == 0) {
    *out = CAP_LOG_WARN;
    return 0;
  }
  return CAP_EINVAL;
}

int cap__log_open(const char *path) {
  if (!path || !*path) {
    if (log_file)
      fclose(log_file);
    log_file = NULL;
    return 0;
  }
  FILE *f = fopen(path, "a");
  if (!f)
    return CAP_EIO;
  setvbuf(f, NULL, _IOLBF, 0);
  if (log_file)
    fclose(log_file);
  log_file = f;
  return 0;
}

void cap__vlog(cap_log_level_t level, const char *fmt, va_list ap) {
  if (level > log_level)
    return;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char line[2048];
  int n = snprintf(line, sizeof line,
                   "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ capuchind[%ld] %s: ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, (long)(tv.tv_usec / 1000),
                   (long)getpid(), level_names[level]);
  if (n < 0)
    return;
  if ((size_t)n < sizeof line - 2)
    vsnprintf(line + n, sizeof line - 2 - (size_t)n, fmt, ap);
  size_t len = strlen(line);
  line[len++] = '\n';
  line[len] = 0;
  /* One write per line so that lines of concurrent threads do not mix. */
  FILE *f = log_file ? log_file : stderr;
  fwrite(line, 1, len, f);
  fflush(f);
}

void cap__log(cap_log_level_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cap__vlog(level, fmt, ap);
  va_end(ap);
}
