/* Kiln's runtime C API: load a .kiln package and run it with caller-owned buffers. Link
 * libkiln_runtime only (pkg-config kiln-runtime); no compiler, no Python, no protobuf.
 *
 *   kiln_model* m = kiln_model_open("model.kiln");
 *   if (!m) { fprintf(stderr, "%s\n", kiln_last_error()); return 1; }
 *   kiln_tensor_info in; kiln_model_input(m, 0, &in);        // name, dtype, shape, bytes
 *   const void* inputs[] = {x};  void* outputs[] = {y};
 *   if (kiln_model_run(m, inputs, 1, outputs, 1) != 0) ...   // kiln_last_error() says why
 *   kiln_model_close(m);
 *
 * Thread safety: kiln_model_open, kiln_model_close and kiln_last_error may be called from any
 * thread. kiln_model_run may be called on one model from several threads at once: each call
 * runs on an execution context of its own (at most 8 are kept; a ninth concurrent call waits).
 * The describe calls (kiln_model_num_*, kiln_model_input/output) read immutable data and are
 * safe at any time. kiln_model_close must not race with other calls on the same model. The last
 * error is per thread.
 *
 * Threads of a CPU package: its kernels run on OpenMP threads. kiln_model_open builds the
 * package's oneDNN primitives for the opening thread's OpenMP thread count (omp_get_max_threads:
 * OMP_NUM_THREADS or omp_set_num_threads), at most the count the package was built with; a call
 * uses no more than that. Set the count before kiln_model_open: a primitive keeps the count it
 * was built for, so lowering it later does not make calls use fewer threads.
 *
 * Buffers: inputs[i] holds kiln_model_input(i).bytes bytes, contiguous row-major in its dtype;
 * outputs[i] receives kiln_model_output(i).bytes bytes. Buffers need no particular alignment. */
#ifndef KILN_KILN_RUNTIME_H
#define KILN_KILN_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_model kiln_model;

#define KILN_MAX_RANK 8

typedef struct kiln_tensor_info {
  const char* name;  /* valid until kiln_model_close */
  const char* dtype; /* "float32", "bfloat16", "int64", ... */
  int32_t rank;
  int64_t shape[KILN_MAX_RANK];
  size_t bytes;      /* numel * element size */
} kiln_tensor_info;

/* The package format version this runtime reads. */
int kiln_runtime_format_version(void);

/* Loads and verifies a package. NULL on failure (kiln_last_error() says why). */
kiln_model* kiln_model_open(const char* path);
void kiln_model_close(kiln_model* model);

int kiln_model_num_inputs(const kiln_model* model);
int kiln_model_num_outputs(const kiln_model* model);
/* 0 on success, -1 when index is out of range. */
int kiln_model_input(const kiln_model* model, int index, kiln_tensor_info* info);
int kiln_model_output(const kiln_model* model, int index, kiln_tensor_info* info);

/* The name dim `dim` of input (or output) `index` had in the source model when it was symbolic
 * there ("batch_size", "batch"), or NULL for a fixed dim, a package without dim names, or an
 * index out of range. The package is specialized to the size kiln_model_input reports for that
 * dim, and a run checks it (docs/package.md, "Signature, symbols and guards"). Valid until
 * kiln_model_close. */
const char* kiln_model_input_dim_name(const kiln_model* model, int index, int dim);
const char* kiln_model_output_dim_name(const kiln_model* model, int index, int dim);

/* Runs the model: 0 on success, -1 on failure (kiln_last_error() says why). */
int kiln_model_run(kiln_model* model, const void* const* inputs, size_t num_inputs,
                   void* const* outputs, size_t num_outputs);

/* The last error of this thread ("" when none); valid until the thread's next failing call. */
const char* kiln_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_RUNTIME_H */
