// CUDA kernels of the cuda device backend (backend_cuda.c): the synthetic op
// capuchin-replay runs in place of a framework's kernel. Compiled by nvcc to
// a fatbin embedded in the library (client/cmake/embed.cmake) and loaded with
// cudaLibraryLoadData, so that the library itself is plain C.
//
// The layout of cap_kargs must match struct kargs in backend_cuda.c.

#include <cstddef>

#define CAP_KMAX 32
#define CAP_OPBUF_VERIFY 1u
#define CAP_OPBUF_FILL 2u

struct cap_kbuf {
  unsigned long long ptr, bytes, verify_seed, fill_seed;
  unsigned int flags, pad;
};

struct cap_kargs {
  cap_kbuf b[CAP_KMAX];
  unsigned int n, pad;
  long long duration_ns;
  unsigned long long *mismatches; // device counter, added to
  unsigned long long *sink;       // never written in practice
};
// backend_cuda.c asserts the same sizes and offsets for its copy.
static_assert(sizeof(cap_kbuf) == 40, "cap_kbuf: 4 u64 + 2 u32");
static_assert(sizeof(cap_kargs) == 1312, "cap_kargs: as kargs in backend_cuda.c");
static_assert(offsetof(cap_kargs, n) == 1280 && offsetof(cap_kargs, duration_ns) == 1288 &&
                  offsetof(cap_kargs, mismatches) == 1296 && offsetof(cap_kargs, sink) == 1304,
              "cap_kargs field offsets, as kargs in backend_cuda.c");

// Same as cap_pattern_word() in backend.h.
__device__ __forceinline__ unsigned long long pattern_word(unsigned long long seed,
                                                           unsigned long long i) {
  unsigned long long z = seed + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) + i * 0x9e3779b97f4a7c15ull;
}

__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Hands the counter to the host and zeroes it, in stream order: one thread
// stores it into mapped pinned memory, so that reading a count back takes
// no copy engine. A cudaMemcpyAsync of the 8 bytes would queue behind the
// swap-outs the same engine is running, and every integrity check of a
// replay waited up to a whole swap-out's copy for its count.
extern "C" __global__ void cap_counter_take(unsigned long long *counter,
                                            volatile unsigned long long *host) {
  *host = *counter;
  *counter = 0;
}

// Every thread handles the same word indices of every buffer in both
// phases, so an in-place buffer (verify then fill) needs no grid barrier.
extern "C" __global__ void cap_op_kernel(cap_kargs a) {
  unsigned long long t0 = globaltimer_ns();
  unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long bad = 0, acc = 0;
  for (unsigned k = 0; k < a.n; k++) {
    const cap_kbuf &b = a.b[k];
    unsigned long long *p = (unsigned long long *)b.ptr;
    unsigned long long words = b.bytes / 8;
    for (unsigned long long i = tid; i < words; i += nth) {
      unsigned long long v = p[i];
      if (b.flags & CAP_OPBUF_VERIFY)
        bad += v != pattern_word(b.verify_seed, i);
      else
        acc ^= v; // an input that is only read
    }
    unsigned long long tail = b.bytes % 8;
    if (tail && tid == 0 && (b.flags & CAP_OPBUF_VERIFY)) {
      unsigned long long w = pattern_word(b.verify_seed, words);
      const unsigned char *q = (const unsigned char *)(p + words);
      for (unsigned j = 0; j < tail; j++)
        if (q[j] != (unsigned char)(w >> (8 * j))) {
          bad++;
          break;
        }
    }
  }
  for (unsigned k = 0; k < a.n; k++) {
    const cap_kbuf &b = a.b[k];
    if (!(b.flags & CAP_OPBUF_FILL))
      continue;
    unsigned long long *p = (unsigned long long *)b.ptr;
    unsigned long long words = b.bytes / 8;
    for (unsigned long long i = tid; i < words; i += nth)
      p[i] = pattern_word(b.fill_seed, i);
    unsigned long long tail = b.bytes % 8;
    if (tail && tid == 0) {
      unsigned long long w = pattern_word(b.fill_seed, words);
      unsigned char *q = (unsigned char *)(p + words);
      for (unsigned j = 0; j < tail; j++)
        q[j] = (unsigned char)(w >> (8 * j));
    }
  }
  if (bad)
    atomicAdd(a.mismatches, bad);
  if (acc == 0x5eed5eed5eed5eedull && a.sink) // keeps the reads
    *a.sink = acc;
  if (tid == 0 && a.duration_ns > 0) {
    unsigned long long end = t0 + (unsigned long long)a.duration_ns;
    while (globaltimer_ns() < end)
      __nanosleep(1000);
  }
}
