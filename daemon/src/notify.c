/*
 * sd_notify(3) without libsystemd: one datagram to the AF_UNIX socket named
 * by $NOTIFY_SOCKET ('@' prefix: abstract namespace), as systemd's
 * Type=notify expects.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon_internal.h"

int cap__notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path)
    return 0;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t plen = strlen(path);
  if (plen >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@'))
    return CAP_EINVAL;
  memcpy(sa.sun_path, path, plen);
  if (path[0] == '@')
    sa.sun_path[0] = 0;
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return CAP_EIO;
  ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
                     (struct sockaddr *)&sa, salen);
  int saved = errno;
  close(fd);
  if (n < 0) {
    cap__log(CAP_LOG_WARN, "sd_notify %s: %s", path, strerror(saved));
    return CAP_EIO;
  }
  return 1;
}
