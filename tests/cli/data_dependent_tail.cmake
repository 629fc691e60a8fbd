# cli.data_dependent_tail: an ONNX model whose output sizes depend on values (det_nms: a score
# threshold, top-k and NMS; Note [Data-dependent tails]) runs under `kiln bench` (the graph
# compiled, then the tail) and `kiln explain` shows the break before the tail; `kiln compile -o`
# refuses it with a message that says why and what to do, and writes no file.
# Usage: cmake -DKILN=<path to kiln> -DOUT=<scratch dir> -P data_dependent_tail.cmake
if(DEFINED ENV{KILN_CACHE_DIR} AND NOT "$ENV{KILN_CACHE_DIR}" STREQUAL "")
  set(model "$ENV{KILN_CACHE_DIR}/models/det_nms.onnx")
else()
  set(model "$ENV{HOME}/.cache/kiln/models/det_nms.onnx")
endif()
if(NOT EXISTS "${model}")
  message(FATAL_ERROR "${model} is missing: the models.export fixture exports it")
endif()
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(COMMAND ${KILN} bench ${model} --iters 5 --warmup 1 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln bench det_nms.onnx exited with ${rc}: ${err}")
endif()
string(JSON p50 GET "${out}" p50_ms)
if(NOT p50 GREATER 0)
  message(FATAL_ERROR "kiln bench det_nms.onnx: p50_ms is '${p50}'")
endif()
execute_process(COMMAND ${KILN} explain ${model}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "breaks: 1" OR NOT out MATCHES "data-dependent part")
  message(FATAL_ERROR "kiln explain det_nms.onnx: exit ${rc}, expected one break before the "
                      "data-dependent part:\n${out}${err}")
endif()
execute_process(COMMAND ${KILN} compile ${model} -o ${OUT}/det.kiln
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "cannot be packaged yet" OR NOT err MATCHES "NonZero")
  message(FATAL_ERROR "kiln compile det_nms.onnx: exit ${rc}, expected a refusal naming the "
                      "NonZero node: ${out}${err}")
endif()
if(EXISTS "${OUT}/det.kiln")
  message(FATAL_ERROR "kiln compile det_nms.onnx refused but wrote ${OUT}/det.kiln")
endif()
message("data-dependent tail: ok")
