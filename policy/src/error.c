#include "capuchin/error.h"

const char *cap_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
#define CAP__ERR_MSG(name, code, msg)                                          \
  case code:                                                                   \
    return msg;
    CAP_ERRNO_MAP(CAP__ERR_MSG)
#undef CAP__ERR_MSG
  default:
    return "unknown error";
  }
}

const char *cap_err_name(int err) {
  switch (err) {
  case 0:
    return "CAP_OK";
#define CAP__ERR_NAME(name, code, msg)                                         \
  case code:                                                                   \
    return "CAP_" #name;
    CAP_ERRNO_MAP(CAP__ERR_NAME)
#undef CAP__ERR_NAME
  default:
    return "CAP_EUNKNOWN";
  }
}
