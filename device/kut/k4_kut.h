/* k4_kut.h -- the kernel-under-test interface: a K4 implementation as a shared library that
 * the project's suites run stage by stage against the reference's goldens.
 *
 * A library exports one C function, k4_kut_get(), returning its table (k4_kut_impl). The
 * harness (k4_kut run, k4.testing.load_kut from Python) loads it with dlopen, and for every
 * golden of the sweep, every rank and every stage the library supports:
 *   - places the golden's inputs of that stage (the schema's <stage>/inputs, links followed:
 *     docs/golden-format.md) in memory of the library's kind (K4_KUT_HOST: host memory;
 *     K4_KUT_DEVICE: device memory of the current GPU), in the logical row-major layout,
 *     each element as its storage type (bf16 uint16, f32 as its 32 bits, E4M3 / E8M0 / packed
 *     E2M1 bytes, i32);
 *   - gives output buffers of the schema's shapes for the stage's outputs (this rank's: oproj
 *     "partial", moe "route_ids" .. "partial"; the all-reduced rows are the harness's), filled
 *     with the byte 0xA5 so that an output left unwritten is caught;
 *   - calls run_stage and compares every output bit for bit with the golden's, reporting the
 *     first divergence of each case with its case, rank, stage, tensor and element.
 * Each stage gets the golden's own inputs, so each is judged on its own.
 *
 * Layout conversion: an implementation that reads its own layout (shuffled weight tiles, a
 * paged cache of its own) converts inside run_stage, or once in prepare(): prepare is called
 * with a stage's inputs before the stage's first run_stage of a golden and may set
 * call->user to data of its own (converted weights) that the following run_stage calls of
 * the same golden, rank and stage receive; release(user) is called after them.
 *
 * Lifetime: the harness loads a library once and never unloads it (RTLD_NODELETE), so what the
 * library starts (an OpenMP pool's threads, its own static CUDA / HIP runtime and its exit
 * handlers) may outlive the calls; it ends with the process. Nothing needs tearing down.
 *
 * The table may grow at its end; abi_version says which fields the library fills.
 */
#ifndef K4_KUT_H
#define K4_KUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define K4_KUT_ABI_VERSION 1

/* Storage dtypes (the schema's "dtype" attribute). */
enum k4_kut_dtype { K4_KUT_BF16 = 0, K4_KUT_F32 = 1, K4_KUT_I32 = 2, K4_KUT_U8 = 3, K4_KUT_E4M3 = 4, K4_KUT_E8M0 = 5, K4_KUT_E2M1X2 = 6 };

/* Where the tensors' data pointers live. */
enum k4_kut_memory { K4_KUT_HOST = 0, K4_KUT_DEVICE = 1 };

typedef struct k4_kut_tensor {
  const char* name;   /* the schema name: "o", "m", "sparse_table", ... */
  int dtype;          /* enum k4_kut_dtype */
  int ndim;           /* 1..4 */
  int64_t shape[4];   /* row-major; the schema's dims (docs/golden-format.md) */
  const char* dims;   /* the dims' names: "token,split,dim" */
  void* data;         /* host or device memory (k4_kut_impl.memory); inputs are read-only */
  size_t bytes;       /* elements * storage bytes */
} k4_kut_tensor;

typedef struct k4_kut_stage_call {
  const char* stage;          /* "index", "split", "merge", "oproj", "router", "moe" */
  int rank, tp, tokens;
  int q_len;                  /* rows a request (the index stage's one non-tensor input) */
  const char* config_json;    /* the golden's config: every field of reference/config.hpp */
  const k4_kut_tensor* inputs;
  int n_inputs;
  k4_kut_tensor* outputs;     /* to fill */
  int n_outputs;
  void* stream;               /* the cudaStream_t / hipStream_t to use (K4_KUT_DEVICE), else NULL */
  void* user;                 /* what prepare() set, else NULL */
} k4_kut_stage_call;

typedef struct k4_kut_impl {
  int abi_version;            /* K4_KUT_ABI_VERSION */
  const char* name;           /* shown in reports */
  int memory;                 /* enum k4_kut_memory */
  /* Nonzero when the library implements the stage. */
  int (*supports)(const char* stage);
  /* Runs one stage of one rank: 0 on success; else nonzero with a message in error. */
  int (*run_stage)(k4_kut_stage_call* call, char* error, size_t error_size);
  /* Optional (NULL): layout conversion before a stage's runs (see above). */
  int (*prepare)(k4_kut_stage_call* call, char* error, size_t error_size);
  void (*release)(void* user);
} k4_kut_impl;

/* The one symbol a kernel-under-test library exports. */
const k4_kut_impl* k4_kut_get(void);
typedef const k4_kut_impl* (*k4_kut_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* K4_KUT_H */
