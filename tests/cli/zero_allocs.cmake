# bench.zero_allocs_steady_state: a compiled call of a graph made only of generated loop kernels
# (the zoo's mlp: two GEMV reductions) does no heap allocation in steady state. `kiln bench`
# counts malloc-family calls around each timed call (tools/alloc_counter.cc); the count must be
# exactly 0, and the eager baseline, which allocates its outputs op by op, must count some
# (so the counter is known to work); one call's allocations attributed to Kiln's own code
# (Note [allocation sites]) are 0 compiled and more than 0 eager. Not a timing test.
# Usage: cmake -DKILN=<path to kiln> -P zero_allocs.cmake
foreach(backend compiled eager)
  execute_process(COMMAND ${KILN} bench mlp --backend ${backend} --iters 50 --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kiln bench mlp --backend ${backend} exited with ${rc}: ${err}")
  endif()
  string(JSON allocs GET "${out}" steady_state_allocs_per_call)
  string(JSON used GET "${out}" backend)
  message("${used}: ${allocs} heap allocations per call")
  if(backend STREQUAL "compiled")
    if(NOT used STREQUAL "compiled(inductor)")
      message(FATAL_ERROR "expected the inductor backend, got ${used}")
    endif()
    if(NOT allocs EQUAL 0)
      message(FATAL_ERROR "compiled mlp allocates ${allocs} times per call; expected 0")
    endif()
  elseif(NOT allocs GREATER 0)
    message(FATAL_ERROR "eager mlp reports ${allocs} allocations per call: the counter is not working")
  endif()
  # Note [allocation sites]: the eager outputs are Kiln's own allocations (so the recorder is
  # known to attribute to Kiln); the compiled call asks for none.
  string(JSON kiln_allocs GET "${out}" steady_state_allocs_by_module kiln)
  message("${used}: ${kiln_allocs} of one call's allocations are Kiln's own")
  if(backend STREQUAL "compiled" AND NOT kiln_allocs EQUAL 0)
    message(FATAL_ERROR "compiled mlp: Kiln's code allocates ${kiln_allocs} times in a call")
  elseif(backend STREQUAL "eager" AND NOT kiln_allocs GREATER 0)
    message(FATAL_ERROR "eager mlp: no allocation attributed to Kiln: the site recorder is not "
                        "working: ${out}")
  endif()
endforeach()
