/*
 * capuchind options: defaults, "key = value" config files and the
 * command line share one setter so that every option works in both places.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_internal.h"

static int set_path(char *dst, size_t cap, const char *v, const char *key,
                    char *err, size_t err_len) {
  size_t n = strlen(v);
  if (n == 0 || n >= cap) {
    snprintf(err, err_len, "%s: path must be 1..%zu bytes", key, cap - 1);
    return CAP_ERANGE;
  }
  memcpy(dst, v, n + 1);
  return 0;
}

void cap_daemon_config_init(cap_daemon_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  const char *env = getenv("CAPUCHIN_SOCKET");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (env && *env && strlen(env) < sizeof cfg->socket_path)
    snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s", env);
  else if (geteuid() != 0 && xdg && *xdg &&
           strlen(xdg) + 24 < sizeof cfg->socket_path)
    snprintf(cfg->socket_path, sizeof cfg->socket_path,
             "%s/capuchin/capuchind.sock", xdg);
  else
    snprintf(cfg->socket_path, sizeof cfg->socket_path,
             "/run/capuchin/capuchind.sock");
  if (cap_store_default_path(cfg->db_path, sizeof cfg->db_path) != 0)
    snprintf(cfg->db_path, sizeof cfg->db_path, "capuchin.db");
  cfg->log_level = CAP_LOG_INFO;
  cfg->max_sessions = 256;
  cfg->max_frame_bytes = CAP_FRAME_DEFAULT_MAX_BYTES;
  cfg->max_accesses_per_iteration = 4u << 20;
  cfg->max_ops_per_iteration = 1u << 20;
  cfg->max_tensors = 1u << 20;
  cfg->max_pending_write_bytes = 16u << 20;
  /* Real models name a few dozen distinct ops (the traces in tests/data:
   * 25-41); 16384 names of 64 bytes on average is ample. */
  cfg->max_op_names = 16384;
  cfg->max_op_name_bytes = 1u << 20;
  /* A client sends Hello as it connects, and every frame in one write. */
  cfg->handshake_timeout_ms = 10000;
  cfg->idle_timeout_ms = 60000;
  /* A cut is confirmed at the job's next iteration boundary: a training
   * iteration takes well under a second, a job between phases (evaluation,
   * a checkpoint) may take longer. */
  cfg->budget_ack_timeout_ms = 30000;
  cfg->max_queued_store_rows = 1024;
  cfg->db_mode = 0600;
  cfg->bw_tolerance = 0.2;
  snprintf(cfg->planner, sizeof cfg->planner, "capuchin");
  /* Plans place their blocks, so no headroom is given away for the
   * allocator's fragmentation (docs/placement.md). Without placement, 6 %
   * was fastest on the sim backend at 50 % (resnet50, bert_large): 4 % left
   * the allocator too little room, 8 % cost more in the plan than it
   * saved. */
  cfg->placement = true;
  cfg->alloc_headroom_pct = 0;
}

int cap_daemon_parse_bytes(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s))
    return CAP_EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno == ERANGE)
    return CAP_ERANGE;
  unsigned shift = 0;
  if (*end) {
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: return CAP_EINVAL;
    }
    end++;
    if (toupper((unsigned char)*end) == 'I')
      end++;
    if (toupper((unsigned char)*end) == 'B')
      end++;
    if (*end)
      return CAP_EINVAL;
  }
  if (shift && v > (UINT64_MAX >> shift))
    return CAP_ERANGE;
  *out = (uint64_t)v << shift;
  return 0;
}

static int parse_u64(const char *v, uint64_t max, uint64_t *out) {
  if (!v || !isdigit((unsigned char)*v))
    return CAP_EINVAL;
  errno = 0;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  if (*end)
    return CAP_EINVAL;
  if (errno == ERANGE || x > max)
    return CAP_ERANGE;
  *out = x;
  return 0;
}

int cap_daemon_config_set(cap_daemon_config_t *cfg, const char *key,
                          const char *value, char *err, size_t err_len) {
  uint64_t u = 0;
  int rc;
  if (!value) {
    snprintf(err, err_len, "%s: missing value", key);
    return CAP_EINVAL;
  }
#define NUM(max)                                                               \
  do {                                                                         \
    if ((rc = parse_u64(value, (max), &u)) != 0) {                             \
      snprintf(err, err_len, "%s: '%s' is not a number in 0..%" PRIu64, key,   \
               value, (uint64_t)(max));                                        \
      return rc;                                                               \
    }                                                                          \
  } while (0)
#define BYTES()                                                                \
  do {                                                                         \
    if ((rc = cap_daemon_parse_bytes(value, &u)) != 0) {                       \
      snprintf(err, err_len, "%s: '%s' is not a byte count (N[K|M|G|T])", key, \
               value);                                                         \
      return rc;                                                               \
    }                                                                          \
  } while (0)
  if (strcmp(key, "socket") == 0)
    return set_path(cfg->socket_path, sizeof cfg->socket_path, value, key, err,
                    err_len);
  if (strcmp(key, "db") == 0)
    return set_path(cfg->db_path, sizeof cfg->db_path, value, key, err,
                    err_len);
  if (strcmp(key, "config") == 0)
    return set_path(cfg->config_path, sizeof cfg->config_path, value, key, err,
                    err_len);
  if (strcmp(key, "log-file") == 0) {
    if (!*value) {
      cfg->log_file[0] = 0;
      return 0;
    }
    return set_path(cfg->log_file, sizeof cfg->log_file, value, key, err,
                    err_len);
  }
  if (strcmp(key, "gpu-memory") == 0) {
    /* BYTES for every device, or INDEX:BYTES for one. */
    const char *colon = strchr(value, ':');
    uint64_t dev = UINT64_MAX;
    if (colon) {
      char idx[16];
      size_t n = (size_t)(colon - value);
      if (n == 0 || n >= sizeof idx) {
        snprintf(err, err_len, "gpu-memory: '%s' is not BYTES or INDEX:BYTES",
                 value);
        return CAP_EINVAL;
      }
      memcpy(idx, value, n);
      idx[n] = 0;
      if (parse_u64(idx, CAP_DAEMON_MAX_DEVICES - 1, &dev) != 0) {
        snprintf(err, err_len, "gpu-memory: device index '%s' is not in 0..%d",
                 idx, CAP_DAEMON_MAX_DEVICES - 1);
        return CAP_ERANGE;
      }
      value = colon + 1;
    }
    BYTES();
    if (dev == UINT64_MAX)
      cfg->gpu_memory_bytes = u;
    else
      cfg->gpu_memory_dev[dev] = u;
    return 0;
  }
  if (strcmp(key, "allow-uid") == 0 || strcmp(key, "allow-gid") == 0) {
    NUM(UINT32_MAX - 1);
    bool uid = key[6] == 'u';
    uint32_t *n = uid ? &cfg->n_allow_uids : &cfg->n_allow_gids;
    uint32_t *list = uid ? cfg->allow_uids : cfg->allow_gids;
    for (uint32_t i = 0; i < *n; i++)
      if (list[i] == u)
        return 0;
    if (*n >= CAP_DAEMON_MAX_ALLOW) {
      snprintf(err, err_len, "%s: at most %d entries", key,
               CAP_DAEMON_MAX_ALLOW);
      return CAP_ERANGE;
    }
    list[(*n)++] = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "log-level") == 0) {
    if (cap__log_parse_level(value, &cfg->log_level) != 0) {
      snprintf(err, err_len,
               "log-level: '%s' is not one of error, warn, info, debug",
               value);
      return CAP_EINVAL;
    }
    return 0;
  }
  if (strcmp(key, "max-sessions") == 0) {
    NUM(1000000);
    if (u == 0) {
      snprintf(err, err_len, "max-sessions: must be at least 1");
      return CAP_ERANGE;
    }
    cfg->max_sessions = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "max-frame-bytes") == 0) {
    BYTES();
    if (u < 64 || u > CAP_FRAME_MAX_LIMIT) {
      snprintf(err, err_len, "max-frame-bytes: must be 64..%u",
               CAP_FRAME_MAX_LIMIT);
      return CAP_ERANGE;
    }
    cfg->max_frame_bytes = (size_t)u;
    return 0;
  }
  if (strcmp(key, "max-accesses-per-iteration") == 0) {
    NUM(UINT32_MAX);
    cfg->max_accesses_per_iteration = u;
    return 0;
  }
  if (strcmp(key, "max-ops-per-iteration") == 0) {
    NUM(UINT32_MAX >> 1);
    cfg->max_ops_per_iteration = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "max-tensors") == 0) {
    NUM(UINT32_MAX >> 1);
    cfg->max_tensors = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "max-pending-write-bytes") == 0) {
    BYTES();
    cfg->max_pending_write_bytes = (size_t)u;
    return 0;
  }
  if (strcmp(key, "max-op-names") == 0) {
    NUM(UINT32_MAX >> 1);
    cfg->max_op_names = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "max-op-name-bytes") == 0) {
    BYTES();
    cfg->max_op_name_bytes = u;
    return 0;
  }
  if (strcmp(key, "handshake-timeout-ms") == 0 ||
      strcmp(key, "idle-timeout-ms") == 0 ||
      strcmp(key, "budget-ack-timeout-ms") == 0) {
    NUM(86400000);
    if (u < 10) {
      snprintf(err, err_len, "%s: must be at least 10 ms", key);
      return CAP_ERANGE;
    }
    if (key[0] == 'h')
      cfg->handshake_timeout_ms = (uint32_t)u;
    else if (key[0] == 'i')
      cfg->idle_timeout_ms = (uint32_t)u;
    else
      cfg->budget_ack_timeout_ms = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "max-queued-store-rows") == 0) {
    NUM(1u << 24);
    if (u == 0) {
      snprintf(err, err_len, "max-queued-store-rows: must be at least 1");
      return CAP_ERANGE;
    }
    cfg->max_queued_store_rows = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "db-mode") == 0) {
    char *end;
    errno = 0;
    unsigned long m = strtoul(value, &end, 8);
    if (errno || end == value || *end || (m != 0600 && m != 0640 && m != 0660)) {
      snprintf(err, err_len, "db-mode: '%s' is not 0600, 0640 or 0660", value);
      return CAP_EINVAL;
    }
    cfg->db_mode = (uint32_t)m;
    return 0;
  }
  if (strcmp(key, "bandwidth-tolerance") == 0) {
    char *end;
    double x = strtod(value, &end);
    if (*end || !(x >= 0 && x <= 10)) {
      snprintf(err, err_len, "bandwidth-tolerance: '%s' is not in 0..10",
               value);
      return CAP_ERANGE;
    }
    cfg->bw_tolerance = x;
    return 0;
  }
  if (strcmp(key, "planner") == 0) {
    bool known = false;
    for (int i = 0; cap_planner_names[i]; i++)
      if (strcmp(cap_planner_names[i], value) == 0)
        known = true;
    if (!known) {
      snprintf(err, err_len, "planner: unknown planner '%s'", value);
      return CAP_EINVAL;
    }
    snprintf(cfg->planner, sizeof cfg->planner, "%s", value);
    return 0;
  }
  if (strcmp(key, "alloc-headroom") == 0) {
    char *end;
    double x = strtod(value, &end);
    if (end != value && *end == '%')
      end++;
    if (end == value || *end || !(x >= 0 && x <= 50)) {
      snprintf(err, err_len, "alloc-headroom: '%s' is not a percentage in 0..50",
               value);
      return CAP_ERANGE;
    }
    cfg->alloc_headroom_pct = x;
    return 0;
  }
  if (strcmp(key, "placement") == 0) {
    if (strcmp(value, "yes") == 0 || strcmp(value, "on") == 0)
      cfg->placement = true;
    else if (strcmp(value, "no") == 0 || strcmp(value, "off") == 0)
      cfg->placement = false;
    else {
      snprintf(err, err_len, "placement: '%s' is not yes or no", value);
      return CAP_EINVAL;
    }
    return 0;
  }
  if (strcmp(key, "evict-persistent") == 0) {
    if (strcmp(value, "auto") == 0)
      cfg->evict_persistent = CAP_EVICT_PERSISTENT_AUTO;
    else if (strcmp(value, "no") == 0)
      cfg->evict_persistent = CAP_EVICT_PERSISTENT_NO;
    else if (strcmp(value, "yes") == 0)
      cfg->evict_persistent = CAP_EVICT_PERSISTENT_YES;
    else {
      snprintf(err, err_len, "evict-persistent: '%s' is not auto, yes or no",
               value);
      return CAP_EINVAL;
    }
    return 0;
  }
  if (strcmp(key, "stall-probe-ms") == 0) {
    NUM(60000);
    cfg->stall_probe_ms = (uint32_t)u;
    return 0;
  }
#undef NUM
#undef BYTES
  snprintf(err, err_len, "unknown option '%s'", key);
  return CAP_ENOENT;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1]))
    s[--n] = 0;
  return s;
}

int cap_daemon_config_load(cap_daemon_config_t *cfg, const char *path,
                           char *err, size_t err_len) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, err_len, "%s: %s", path, strerror(errno));
    return errno == ENOENT ? CAP_ENOENT : CAP_EIO;
  }
  char line[8192];
  unsigned lineno = 0;
  int rc = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strlen(line);
    if (n == sizeof line - 1 && line[n - 1] != '\n') {
      snprintf(err, err_len, "%s:%u: line too long", path, lineno);
      rc = CAP_EPARSE;
      goto out_close;
    }
    char *hash = strchr(line, '#');
    if (hash)
      *hash = 0;
    char *s = trim(line);
    if (!*s)
      continue;
    char *eq = strchr(s, '=');
    if (!eq) {
      snprintf(err, err_len, "%s:%u: expected 'key = value'", path, lineno);
      rc = CAP_EPARSE;
      goto out_close;
    }
    *eq = 0;
    char *key = trim(s), *value = trim(eq + 1);
    if (strcmp(key, "config") == 0) {
      snprintf(err, err_len, "%s:%u: 'config' cannot be set in a config file",
               path, lineno);
      rc = CAP_EINVAL;
      goto out_close;
    }
    char msg[512];
    rc = cap_daemon_config_set(cfg, key, value, msg, sizeof msg);
    if (rc != 0) {
      snprintf(err, err_len, "%s:%u: %s", path, lineno, msg);
      goto out_close;
    }
  }
  if (ferror(f)) {
    snprintf(err, err_len, "%s: read error", path);
    rc = CAP_EIO;
  }
out_close:
  fclose(f);
  return rc;
}
