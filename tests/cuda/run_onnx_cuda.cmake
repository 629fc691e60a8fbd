# cuda.run_onnx: `kiln run MODEL.onnx --device cuda` on any machine. Without a GPU it must fail
# cleanly, saying "no CUDA device" (CI); with one it compiles the model on the device and every
# output must be within 1e-4 x max|CPU eager| of the CPU eager run (the GPU machine).
# Usage: cmake -DKILN=<kiln> -DMODEL=<file.onnx> -P run_onnx_cuda.cmake
execute_process(COMMAND ${KILN} device RESULT_VARIABLE drc OUTPUT_VARIABLE dout)
execute_process(COMMAND ${KILN} run ${MODEL} --device cuda --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(dout MATCHES "no CUDA device")
  if(rc EQUAL 0)
    message(FATAL_ERROR "kiln run --device cuda succeeded without a CUDA device")
  endif()
  if(NOT err MATCHES "no CUDA device")
    message(FATAL_ERROR "kiln run --device cuda without a GPU did not say 'no CUDA device'")
  endif()
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln run --device cuda exited with ${rc}")
endif()
string(JSON n LENGTH "${out}" outputs)
if(n EQUAL 0)
  message(FATAL_ERROR "no outputs in the JSON")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON diff GET "${out}" outputs ${i} max_abs_diff_compiled_vs_eager)
  string(JSON scale GET "${out}" outputs ${i} max_abs_eager)
  # CMake has no floating-point compare: let the shell's awk decide diff <= 1e-4 * scale > 0.
  execute_process(COMMAND awk "BEGIN { exit !(${scale} > 0 && ${diff} <= 1e-4 * ${scale}) }"
                  RESULT_VARIABLE ok)
  if(NOT ok EQUAL 0)
    message(FATAL_ERROR "output ${i}: max|cuda - cpu| ${diff} against max|cpu| ${scale}")
  endif()
endforeach()
