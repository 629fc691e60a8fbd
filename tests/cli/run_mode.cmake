# cli.run_mode: `kiln run --mode` compiles in the given mode (the JSON says which), the outputs
# --output writes for --backend compiled are the compiled run's, a reduce-overhead run writes
# the same bytes as a default run (the CPU runs the same launch list in both), and a bad mode,
# or a mode with --backend eager, is an error that says what to do.
# Usage: cmake -DKILN=<path to kiln> -DOUT=<scratch dir> -P run_mode.cmake
file(REMOVE_RECURSE "${OUT}")
foreach(mode default reduce-overhead)
  execute_process(COMMAND ${KILN} run vfe --backend compiled --mode ${mode} --iters 1 --warmup 0
                          --json --output ${OUT}/${mode}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kiln run vfe --mode ${mode} exited with ${rc}: ${err}")
  endif()
  string(JSON got GET "${out}" mode)
  if(NOT got STREQUAL mode)
    message(FATAL_ERROR "run --mode ${mode}: JSON mode is '${got}'")
  endif()
  file(GLOB npy "${OUT}/${mode}/*.npy")
  list(LENGTH npy n)
  if(n EQUAL 0)
    message(FATAL_ERROR "run --mode ${mode} --output wrote no outputs")
  endif()
endforeach()
file(GLOB outs RELATIVE "${OUT}/default" "${OUT}/default/*.npy")
foreach(f ${outs})
  file(SHA256 "${OUT}/default/${f}" a)
  file(SHA256 "${OUT}/reduce-overhead/${f}" b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${f}: reduce-overhead wrote other bytes than default")
  endif()
endforeach()
foreach(args "run;mlp;--mode;fast" "run;mlp;--mode;reduce-overhead;--backend;eager")
  execute_process(COMMAND ${KILN} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "--mode")
    message(FATAL_ERROR "kiln ${args}: exit ${rc}, expected an error about --mode: ${err}")
  endif()
endforeach()
message("run mode option: ok")
