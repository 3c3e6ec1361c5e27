/*
 * capuchind: the Capuchin daemon. Parses the command line over the
 * config file over the defaults, then runs cap_daemon on this thread until
 * SIGTERM/SIGINT.
 */
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/daemon.h"
#include "capuchin/error.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: capuchind [--socket PATH] [--db PATH] [--config FILE]\n"
          "                 [--gpu-memory BYTES] [--allow-uid UID]... "
          "[--allow-gid GID]...\n"
          "                 [--log-level error|warn|info|debug] "
          "[--max-sessions N]\n"
          "                 [--log-file PATH] [--max-frame-bytes BYTES]\n"
          "                 [--max-accesses-per-iteration N] "
          "[--max-ops-per-iteration N]\n"
          "                 [--max-tensors N] [--planner NAME] "
          "[--bandwidth-tolerance X]\n"
          "                 [--evict-persistent auto|yes|no] "
          "[--placement yes|no] [--alloc-headroom PCT]\n"
          "                 [--max-op-names N] [--max-op-name-bytes BYTES]\n"
          "                 [--handshake-timeout-ms MS] [--idle-timeout-ms MS]\n"
          "                 [--budget-ack-timeout-ms MS]\n"
          "                 [--max-queued-store-rows N] [--db-mode 0600|0640|0660]\n"
          "\n"
          "Defaults: socket $CAPUCHIN_SOCKET, else /run/capuchin/capuchind.sock "
          "as root\n"
          "or $XDG_RUNTIME_DIR/capuchin/capuchind.sock; database "
          "/var/lib/capuchin/capuchin.db\n"
          "as root or $XDG_STATE_HOME/capuchin/capuchin.db. The config file "
          "holds the same\n"
          "options as 'key = value' lines; the command line wins. SIGHUP "
          "re-reads it.\n");
}

static const char *const keys[] = {
    "socket", "db", "config", "gpu-memory", "allow-uid", "allow-gid",
    "log-level", "max-sessions", "log-file", "max-frame-bytes",
    "max-accesses-per-iteration", "max-ops-per-iteration", "max-tensors",
    "planner", "bandwidth-tolerance", "stall-probe-ms", "evict-persistent",
    "placement", "alloc-headroom", "max-op-names", "max-op-name-bytes",
    "handshake-timeout-ms", "idle-timeout-ms", "budget-ack-timeout-ms",
    "max-queued-store-rows",
    "db-mode", NULL};

int main(int argc, char **argv) {
#ifdef __GLIBC__
  /* One heap for the loop and the work threads: glibc gives each thread
   * that allocates an arena of its own, and what a burst of clients leaves
   * in the extra arenas (SQLite's cache pages, planning buffers) is not
   * given back by malloc_trim; measured, 4 arenas kept 1.3 MB after a
   * hostile client left. The threads allocate little, so
   * sharing one arena costs nothing measurable. */
  mallopt(M_ARENA_MAX, 1);
#endif
  struct option opts[40];
  int n = 0;
  for (; keys[n]; n++)
    opts[n] = (struct option){keys[n], required_argument, NULL, 1000 + n};
  opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
  opts[n] = (struct option){0, 0, 0, 0};

  /* Two passes: the command line alone (kept for SIGHUP), then defaults <
   * config file < command line. */
  cap_daemon_config_t cmd, cfg;
  cap_daemon_config_init(&cmd);
  char err[1024];
  const char *config_path = NULL;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (c == 'h') {
      usage(stdout);
      return 0;
    }
    if (c < 1000) {
      usage(stderr);
      return 64;
    }
    const char *key = keys[c - 1000];
    if (strcmp(key, "config") == 0)
      config_path = optarg;
    if (cap_daemon_config_set(&cmd, key, optarg, err, sizeof err) != 0) {
      fprintf(stderr, "capuchind: --%s\n", err);
      usage(stderr);
      return 64;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "capuchind: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 64;
  }
  cap_daemon_config_init(&cfg);
  if (config_path) {
    if (cap_daemon_config_load(&cfg, config_path, err, sizeof err) != 0) {
      fprintf(stderr, "capuchind: %s\n", err);
      return 78; /* EX_CONFIG */
    }
  }
  /* Apply the command line again over the file. */
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1)
    cap_daemon_config_set(&cfg, keys[c - 1000], optarg, err, sizeof err);

  cap_daemon_t *d = NULL;
  int rc = cap_daemon_create(&cfg, &cmd, &d, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "capuchind: %s\n", err);
    return rc == CAP_EVERSION || rc == CAP_ECORRUPT ? 65 : 1;
  }
  rc = cap_daemon_run(d, 1);
  cap_daemon_destroy(d);
  return rc == 0 ? 0 : 1;
}
