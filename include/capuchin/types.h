/*
 * The vocabulary the client API shares with the policy library: what kind
 * of tensor a framework registers and the "none" id. Installed with the
 * client's headers so that capuchin/client.h needs nothing else of policy.
 */
#ifndef CAPUCHIN_TYPES_H
#define CAPUCHIN_TYPES_H

#include <stdint.h>

#define CAP_NONE UINT32_MAX /* "no tensor / no op" in uint32_t id fields */

typedef enum {
  CAP_KIND_PARAM = 0,      /* weights, optimizer state: live all iteration */
  CAP_KIND_INPUT = 1,      /* the batch: live all iteration */
  CAP_KIND_ACTIVATION = 2, /* activations, gradients, temporaries */
} cap_tensor_kind_t;

#endif /* CAPUCHIN_TYPES_H */
