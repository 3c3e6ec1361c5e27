/*
 * Framing: 4-byte big-endian length + packed Envelope; encoder, and a
 * decoder that accepts bytes in any split and never lets a peer make it
 * allocate more than its limits.
 */
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/frame.h"
#include "proto_internal.h"

int cap__proto_fail(char *err, size_t err_len, int code, const char *fmt, ...) {
  if (err && err_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

void cap_frame_limits_init(cap_frame_limits_t *lim) {
  lim->max_frame_bytes = CAP_FRAME_DEFAULT_MAX_BYTES;
  lim->max_alloc_bytes = (size_t)64 << 20;
  lim->max_buffer_bytes = 2 * lim->max_frame_bytes + (64u << 10);
  lim->max_tensor_id = 1u << 31;
  lim->max_op_seq = 1u << 31;
  lim->max_name_len = 4096;
  lim->max_items = 1u << 24;
  lim->max_op_tensors = 65536;
}

void cap__frame_limits_resolve(const cap_frame_limits_t *lim,
                               cap_frame_limits_t *out) {
  cap_frame_limits_t def;
  cap_frame_limits_init(&def);
  if (!lim) {
    *out = def;
    return;
  }
  *out = *lim;
  if (!out->max_frame_bytes)
    out->max_frame_bytes = def.max_frame_bytes;
  if (!out->max_alloc_bytes)
    out->max_alloc_bytes = def.max_alloc_bytes;
  if (!out->max_buffer_bytes) {
    /* The default follows the frame size actually configured. */
    out->max_buffer_bytes = out->max_frame_bytes > CAP_FRAME_MAX_LIMIT
                                ? def.max_buffer_bytes
                                : 2 * out->max_frame_bytes + (64u << 10);
  }
  if (!out->max_tensor_id)
    out->max_tensor_id = def.max_tensor_id;
  if (!out->max_op_seq)
    out->max_op_seq = def.max_op_seq;
  if (!out->max_name_len)
    out->max_name_len = def.max_name_len;
  if (!out->max_items)
    out->max_items = def.max_items;
  if (!out->max_op_tensors)
    out->max_op_tensors = def.max_op_tensors;
}

/* --- Encoding ------------------------------------------------------------ */

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

/* Packing an envelope whose oneof is unset, unknown or points nowhere would
 * write a zero-length frame or dereference NULL. */
static bool envelope_packable(const Capuchin__Envelope *env) {
  if (!env || env->base.descriptor != &capuchin__envelope__descriptor)
    return false;
  if (env->msg_case == CAPUCHIN__ENVELOPE__MSG__NOT_SET)
    return false;
  for (unsigned i = 0; i < capuchin__envelope__descriptor.n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &capuchin__envelope__descriptor.fields[i];
    if (f->id == (uint32_t)env->msg_case)
      return *(void *const *)((const char *)env + f->offset) != NULL;
  }
  return false;
}

size_t cap_frame_size(const Capuchin__Envelope *env) {
  return CAP_FRAME_HEADER_BYTES +
         protobuf_c_message_get_packed_size(&env->base);
}

int cap_frame_encode(const Capuchin__Envelope *env, void *buf, size_t buf_len,
                     size_t *out_len) {
  if (!envelope_packable(env))
    return CAP_EINVAL;
  size_t payload = protobuf_c_message_get_packed_size(&env->base);
  if (payload > CAP_FRAME_MAX_LIMIT)
    return CAP_E2BIG;
  if (out_len)
    *out_len = CAP_FRAME_HEADER_BYTES + payload;
  if (!buf || buf_len < CAP_FRAME_HEADER_BYTES + payload)
    return CAP_ENOMEM;
  uint8_t *p = buf;
  put_be32(p, (uint32_t)payload);
  size_t n = protobuf_c_message_pack(&env->base, p + CAP_FRAME_HEADER_BYTES);
  /* A message whose packed size changed between the two calls is a caller
   * bug (another thread writing it); never send a frame that lies. */
  if (n != payload)
    return CAP_EINVAL;
  return 0;
}

static int encode_checked(const Capuchin__Envelope *env, size_t max_frame,
                          size_t *payload) {
  if (!envelope_packable(env))
    return CAP_EINVAL;
  if (!max_frame)
    max_frame = CAP_FRAME_DEFAULT_MAX_BYTES;
  *payload = protobuf_c_message_get_packed_size(&env->base);
  if (*payload > max_frame || *payload > CAP_FRAME_MAX_LIMIT)
    return CAP_E2BIG;
  return 0;
}

int cap_frame_encode_alloc(const Capuchin__Envelope *env,
                           size_t max_frame_bytes, uint8_t **out,
                           size_t *out_len) {
  size_t payload;
  int rc = encode_checked(env, max_frame_bytes, &payload);
  if (rc < 0)
    return rc;
  uint8_t *buf = malloc(CAP_FRAME_HEADER_BYTES + payload);
  if (!buf)
    return CAP_ENOMEM;
  size_t n;
  rc = cap_frame_encode(env, buf, CAP_FRAME_HEADER_BYTES + payload, &n);
  if (rc < 0) {
    free(buf);
    return rc;
  }
  *out = buf;
  *out_len = n;
  return 0;
}

int cap_frame_append(const Capuchin__Envelope *env, size_t max_frame_bytes,
                     uint8_t **buf, size_t *len, size_t *cap) {
  size_t payload;
  int rc = encode_checked(env, max_frame_bytes, &payload);
  if (rc < 0)
    return rc;
  size_t need = CAP_FRAME_HEADER_BYTES + payload;
  if (*len > SIZE_MAX - need)
    return CAP_ENOMEM;
  if (*len + need > *cap) {
    size_t ncap = *cap ? *cap : 256;
    while (ncap < *len + need)
      ncap = ncap > SIZE_MAX / 2 ? *len + need : ncap * 2;
    uint8_t *nb = realloc(*buf, ncap);
    if (!nb)
      return CAP_ENOMEM;
    *buf = nb;
    *cap = ncap;
  }
  size_t n;
  rc = cap_frame_encode(env, *buf + *len, *cap - *len, &n);
  if (rc < 0)
    return rc;
  *len += n;
  return 0;
}

/* --- Capped allocator -------------------------------------------------------
 * Every block carries its size in a header so that free() can give the bytes
 * back to the budget and the validator can recover a string's wire length. */

typedef struct capped_alloc {
  size_t used; /* bytes held, headers included */
  size_t max;
  bool refused; /* an allocation was refused since the last reset */
} capped_alloc_t;

typedef union block_header {
  size_t size; /* bytes the caller asked for */
  max_align_t align;
} block_header_t;

static void *capped_alloc(void *data, size_t size) {
  capped_alloc_t *a = data;
  if (size > SIZE_MAX - sizeof(block_header_t)) {
    a->refused = true;
    return NULL;
  }
  size_t total = size + sizeof(block_header_t);
  if (total > a->max - a->used) {
    a->refused = true;
    return NULL;
  }
  block_header_t *h = malloc(total);
  if (!h) {
    a->refused = true;
    return NULL;
  }
  h->size = size;
  a->used += total;
  return h + 1;
}

static void capped_free(void *data, void *ptr) {
  if (!ptr)
    return;
  capped_alloc_t *a = data;
  block_header_t *h = (block_header_t *)ptr - 1;
  a->used -= h->size + sizeof(block_header_t);
  free(h);
}

/* Wire length of a string unpacked through the capped allocator. */
static size_t capped_strlen(const char *s, void *ctx) {
  (void)ctx;
  const block_header_t *h = (const block_header_t *)s - 1;
  return h->size ? h->size - 1 : 0;
}

/* --- Decoder ------------------------------------------------------------- */

struct cap_frame_decoder {
  cap_frame_limits_t lim;
  capped_alloc_t alloc_state;
  ProtobufCAllocator alloc;
  uint8_t *buf;
  size_t start; /* first byte not yet consumed */
  size_t end;   /* one past the last byte fed */
  size_t cap;
  /* Offset (from buf) of the next frame header not yet checked; beyond end
   * while a checked frame is still arriving. */
  size_t scan;
  int error; /* sticky: the stream is out of sync */
  uint32_t bad_len; /* the offending header value, for messages */
};

cap_frame_decoder_t *cap_frame_decoder_create(const cap_frame_limits_t *lim) {
  cap_frame_limits_t l;
  cap__frame_limits_resolve(lim, &l);
  if (l.max_frame_bytes > CAP_FRAME_MAX_LIMIT ||
      l.max_buffer_bytes < l.max_frame_bytes + CAP_FRAME_HEADER_BYTES)
    return NULL;
  cap_frame_decoder_t *d = calloc(1, sizeof *d);
  if (!d)
    return NULL;
  d->lim = l;
  d->alloc_state.max = l.max_alloc_bytes;
  d->alloc.alloc = capped_alloc;
  d->alloc.free = capped_free;
  d->alloc.allocator_data = &d->alloc_state;
  return d;
}

void cap_frame_decoder_destroy(cap_frame_decoder_t *d) {
  if (!d)
    return;
  free(d->buf);
  free(d);
}

size_t cap_frame_decoder_buffered(const cap_frame_decoder_t *d) {
  return d->end - d->start;
}

size_t cap_frame_decoder_allocated(const cap_frame_decoder_t *d) {
  return d->alloc_state.used;
}

int cap_frame_decoder_error(const cap_frame_decoder_t *d) { return d->error; }

/* Byte at offset off of the buffered bytes followed by data. */
static uint8_t byte_at(const cap_frame_decoder_t *d, const uint8_t *data,
                       size_t off) {
  return off < d->end ? d->buf[off] : data[off - d->end];
}

int cap_frame_decoder_feed(cap_frame_decoder_t *d, const void *data,
                           size_t len) {
  if (d->error)
    return d->error;
  if (len == 0)
    return 0;
  const uint8_t *in = data;
  /* Check every header these bytes complete before the buffer grows. */
  size_t scan = d->scan;
  while (scan <= d->end + len && d->end + len - scan >= CAP_FRAME_HEADER_BYTES) {
    uint8_t h[4];
    for (int i = 0; i < 4; i++)
      h[i] = byte_at(d, in, scan + (size_t)i);
    uint32_t n = get_be32(h);
    if (n == 0) {
      d->bad_len = 0;
      return d->error = CAP_EPROTO;
    }
    if (n > d->lim.max_frame_bytes) {
      d->bad_len = n;
      return d->error = CAP_E2BIG;
    }
    scan += CAP_FRAME_HEADER_BYTES + n;
  }
  size_t pending = d->end - d->start;
  if (len > d->lim.max_buffer_bytes - pending)
    return d->error = CAP_EQUOTA;
  d->scan = scan;
  if (len > d->cap - d->end) {
    /* Move what is left to the front before growing. */
    if (d->start > 0) {
      memmove(d->buf, d->buf + d->start, pending);
      d->scan -= d->start;
      d->end = pending;
      d->start = 0;
    }
    if (len > d->cap - d->end) {
      size_t need = d->end + len; /* <= max_buffer_bytes */
      size_t ncap = d->cap ? d->cap : 4096;
      while (ncap < need)
        ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
      if (ncap > d->lim.max_buffer_bytes)
        ncap = d->lim.max_buffer_bytes;
      uint8_t *nb = realloc(d->buf, ncap);
      if (!nb)
        return d->error = CAP_ENOMEM;
      d->buf = nb;
      d->cap = ncap;
    }
  }
  memcpy(d->buf + d->end, in, len);
  d->end += len;
  return 0;
}

/* After the last buffered byte is consumed: start over at the front, and give
 * a large buffer (one big frame) back rather than keep it per connection. */
static void buffer_drained(cap_frame_decoder_t *d) {
  d->scan -= d->start;
  d->start = d->end = 0;
  if (d->cap > ((size_t)1 << 20)) {
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
  }
}

static int sticky_message(const cap_frame_decoder_t *d, char *err,
                          size_t err_len) {
  switch (d->error) {
  case CAP_EPROTO:
    return cap__proto_fail(err, err_len, d->error, "zero-length frame");
  case CAP_E2BIG:
    return cap__proto_fail(err, err_len, d->error,
                           "frame of %u bytes exceeds the maximum of %zu",
                           d->bad_len, d->lim.max_frame_bytes);
  case CAP_EQUOTA:
    return cap__proto_fail(err, err_len, d->error,
                           "more than %zu bytes buffered without being read",
                           d->lim.max_buffer_bytes);
  default:
    return cap__proto_fail(err, err_len, d->error, "decoder failed: %s",
                           cap_strerror(d->error));
  }
}

int cap_frame_decoder_next(cap_frame_decoder_t *d, Capuchin__Envelope **out,
                           char *err, size_t err_len) {
  *out = NULL;
  if (d->error)
    return sticky_message(d, err, err_len);
  size_t avail = d->end - d->start;
  if (avail < CAP_FRAME_HEADER_BYTES)
    return 0;
  uint32_t n = get_be32(d->buf + d->start);
  if (avail - CAP_FRAME_HEADER_BYTES < n)
    return 0;
  const uint8_t *payload = d->buf + d->start + CAP_FRAME_HEADER_BYTES;
  d->alloc_state.refused = false;
  Capuchin__Envelope *env = capuchin__envelope__unpack(&d->alloc, n, payload);
  d->start += CAP_FRAME_HEADER_BYTES + (size_t)n;
  if (d->start == d->end)
    buffer_drained(d);
  if (!env) {
    if (d->alloc_state.refused)
      return cap__proto_fail(
          err, err_len, CAP_EQUOTA,
          "frame of %u bytes needs more than the %zu bytes allowed to unpack "
          "(%zu held by earlier messages)",
          n, d->lim.max_alloc_bytes, d->alloc_state.used);
    return cap__proto_fail(err, err_len, CAP_EPARSE,
                           "frame of %u bytes is not a valid Envelope", n);
  }
  int rc = cap__frame_validate(env, &d->lim, capped_strlen, NULL, err, err_len);
  if (rc < 0) {
    capuchin__envelope__free_unpacked(env, &d->alloc);
    return rc;
  }
  *out = env;
  return 1;
}

void cap_frame_decoder_release(cap_frame_decoder_t *d,
                               Capuchin__Envelope *env) {
  if (env)
    capuchin__envelope__free_unpacked(env, &d->alloc);
}

const char *cap_frame_msg_name(const Capuchin__Envelope *env) {
  if (!env || env->msg_case == CAPUCHIN__ENVELOPE__MSG__NOT_SET)
    return "none";
  for (unsigned i = 0; i < capuchin__envelope__descriptor.n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &capuchin__envelope__descriptor.fields[i];
    if (f->id == (uint32_t)env->msg_case)
      return f->name;
  }
  return "unknown";
}
