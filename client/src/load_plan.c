/*
 * Plans from outside the daemon (capuchin-sim --emit-plan, a plan exported
 * from the store). The public API takes the plan's JSON bytes rather than a
 * cap_plan_t so that a training job needs none of the policy library's
 * headers, and the plan's layout can change without breaking its ABI.
 */
#include "client_impl.h"

int cap_client_load_plan_json(cap_client_t *c, const char *json, size_t len) {
  if (!c || !json)
    return CAP_EINVAL;
  char err[256];
  cap_plan_t *plan = NULL;
  int rc = cap_plan_read_json(json, len, &plan, err, sizeof err);
  if (rc != 0) {
    cap__set_error(c, "%s", err[0] ? err : cap_strerror(rc));
    return rc;
  }
  rc = cap__client_load_plan(c, plan);
  cap_plan_destroy(plan);
  return rc;
}
