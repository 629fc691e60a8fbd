/* Loads a .kiln package with the runtime's C API, feeds its inputs and prints its outputs.
 *
 *   kiln_c_run model.kiln [-i IN0.bin -i IN1.bin ...] [-o OUT_PREFIX]
 *
 * Inputs: raw little-endian bytes of each input (its dtype, contiguous); without -i, every
 * float32 input is filled with sin(k) (a fixed pattern). With -o, output i is written as
 * OUT_PREFIX<i>.bin. Prints each output's name, dtype, shape and first values. Links only
 * libkiln_runtime (pkg-config kiln-runtime). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln_runtime.h"

static int read_file(const char* path, void* buf, size_t bytes) {
  FILE* f = fopen(path, "rb");
  if (!f) return -1;
  size_t got = fread(buf, 1, bytes, f);
  int extra = fgetc(f);
  fclose(f);
  return got == bytes && extra == EOF ? 0 : -1;
}

int main(int argc, char** argv) {
  const char* path = NULL;
  const char* out_prefix = NULL;
  const char* in_files[64];
  int n_in_files = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-i") == 0 && i + 1 < argc && n_in_files < 64) in_files[n_in_files++] = argv[++i];
    else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out_prefix = argv[++i];
    else if (!path) path = argv[i];
    else { fprintf(stderr, "usage: kiln_c_run model.kiln [-i IN.bin ...] [-o OUT_PREFIX]\n"); return 2; }
  }
  if (!path) { fprintf(stderr, "usage: kiln_c_run model.kiln [-i IN.bin ...] [-o OUT_PREFIX]\n"); return 2; }

  kiln_model* m = kiln_model_open(path);
  if (!m) { fprintf(stderr, "kiln_c_run: %s\n", kiln_last_error()); return 1; }
  int n_in = kiln_model_num_inputs(m), n_out = kiln_model_num_outputs(m);
  if (n_in_files != 0 && n_in_files != n_in) {
    fprintf(stderr, "kiln_c_run: the model has %d inputs, %d files given\n", n_in, n_in_files);
    kiln_model_close(m);
    return 2;
  }
  void** in = calloc((size_t)n_in + 1, sizeof(void*));
  void** out = calloc((size_t)n_out + 1, sizeof(void*));
  int rc = 0;
  for (int i = 0; i < n_in && rc == 0; ++i) {
    kiln_tensor_info t;
    kiln_model_input(m, i, &t);
    in[i] = malloc(t.bytes ? t.bytes : 1);
    if (n_in_files) {
      if (read_file(in_files[i], in[i], t.bytes) != 0) {
        fprintf(stderr, "kiln_c_run: input %d ('%s') needs exactly %zu bytes in %s\n", i, t.name,
                t.bytes, in_files[i]);
        rc = 2;
      }
    } else if (strcmp(t.dtype, "float32") == 0) {
      float* p = in[i];
      for (size_t k = 0; k < t.bytes / 4; ++k) p[k] = (float)sin((double)k);
    } else {
      memset(in[i], 0, t.bytes);
    }
  }
  for (int i = 0; i < n_out && rc == 0; ++i) {
    kiln_tensor_info t;
    kiln_model_output(m, i, &t);
    out[i] = malloc(t.bytes ? t.bytes : 1);
  }
  if (rc == 0 && kiln_model_run(m, (const void* const*)in, (size_t)n_in, out, (size_t)n_out) != 0) {
    fprintf(stderr, "kiln_c_run: %s\n", kiln_last_error());
    rc = 1;
  }
  for (int i = 0; i < n_out && rc == 0; ++i) {
    kiln_tensor_info t;
    kiln_model_output(m, i, &t);
    printf("output %d '%s' %s [", i, t.name, t.dtype);
    for (int d = 0; d < t.rank; ++d) printf(d ? ",%lld" : "%lld", (long long)t.shape[d]);
    printf("]");
    if (strcmp(t.dtype, "float32") == 0) {
      const float* p = out[i];
      for (size_t k = 0; k < t.bytes / 4 && k < 5; ++k) printf(" %.6g", p[k]);
    }
    printf("\n");
    if (out_prefix) {
      char name[4096];
      snprintf(name, sizeof name, "%s%d.bin", out_prefix, i);
      FILE* f = fopen(name, "wb");
      if (!f || fwrite(out[i], 1, t.bytes, f) != t.bytes) {
        fprintf(stderr, "kiln_c_run: cannot write %s\n", name);
        rc = 1;
      }
      if (f) fclose(f);
    }
  }
  for (int i = 0; i < n_in; ++i) free(in[i]);
  for (int i = 0; i < n_out; ++i) free(out[i]);
  free(in);
  free(out);
  kiln_model_close(m);
  return rc;
}
