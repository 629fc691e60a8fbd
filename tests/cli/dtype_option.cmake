# cli.dtype_option: `--dtype` of kiln run / bench / explain / profile (passes/autocast.h,
# docs/compiler.md).
#   - bench --json reports the dtype, and the aliases bf16/f16 name bfloat16/float16;
#   - run --json reports the dtype and a relative error against the float32 eager run that is
#     nonzero (the model ran low) and below 2^-8 * 16 (Note [Autocast tolerances]);
#   - explain --backend inductor reports how many nodes run in the low dtype;
#   - profile --dtype bf16 times the casts autocast inserts (none in float32);
#   - an unknown dtype, and --dtype with --backend eager, are errors that say what to do.
# Usage: cmake -DKILN=<path to kiln> -P dtype_option.cmake
foreach(pair "bf16;bfloat16" "f16;float16" "float32;float32")
  list(GET pair 0 given)
  list(GET pair 1 want)
  execute_process(COMMAND ${KILN} bench mlp --dtype ${given} --iters 5 --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kiln bench mlp --dtype ${given} exited with ${rc}: ${err}")
  endif()
  string(JSON dtype GET "${out}" dtype)
  if(NOT dtype STREQUAL want)
    message(FATAL_ERROR "bench --dtype ${given}: JSON dtype is '${dtype}', expected '${want}'")
  endif()
endforeach()

execute_process(COMMAND ${KILN} run vfe --dtype bf16 --iters 1 --warmup 0 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln run vfe --dtype bf16 exited with ${rc}: ${err}")
endif()
string(JSON dtype GET "${out}" dtype)
string(JSON rel GET "${out}" outputs 0 max_rel_err_compiled_vs_eager)
message("kiln run vfe --dtype bf16: max relative error ${rel}")
if(NOT dtype STREQUAL "bfloat16")
  message(FATAL_ERROR "run --dtype bf16: JSON dtype is '${dtype}'")
endif()
if(rel EQUAL 0 OR rel GREATER 0.0625)
  message(FATAL_ERROR "run vfe --dtype bf16: relative error ${rel}, expected in (0, 0.0625]")
endif()

execute_process(COMMAND ${KILN} explain mlp --backend inductor --dtype f16
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "precision float16 \\([1-9][0-9]* nodes in float16")
  message(FATAL_ERROR "kiln explain mlp --dtype f16 (exit ${rc}) does not report float16 nodes: ${out}${err}")
endif()

foreach(pair "bf16;TRUE" "float32;FALSE")
  list(GET pair 0 given)
  list(GET pair 1 casts)
  execute_process(COMMAND ${KILN} profile mlp --dtype ${given} --iters 2
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kiln profile mlp --dtype ${given} exited with ${rc}: ${err}")
  endif()
  if(out MATCHES "loop: cast")
    set(found TRUE)
  else()
    set(found FALSE)
  endif()
  if(NOT found STREQUAL casts)
    message(FATAL_ERROR "kiln profile mlp --dtype ${given}: cast kernels present ${found}, expected ${casts}: ${out}")
  endif()
endforeach()

foreach(args "run;mlp;--dtype;int8" "bench;mlp;--dtype;fp8" "explain;mlp;--dtype;float64" "profile;mlp;--dtype;int4")
  execute_process(COMMAND ${KILN} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "--dtype: expected float32, bfloat16 or float16 \\(or f32, bf16, f16\\), found")
    message(FATAL_ERROR "kiln ${args}: exit ${rc}, expected an error naming the accepted dtypes: ${err}")
  endif()
endforeach()
foreach(cmd run profile)
  execute_process(COMMAND ${KILN} ${cmd} mlp --dtype bf16 --backend eager
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "applies to the compiled run")
    message(FATAL_ERROR "kiln ${cmd} --dtype bf16 --backend eager: exit ${rc}: ${err}")
  endif()
endforeach()
message("dtype option: ok")
