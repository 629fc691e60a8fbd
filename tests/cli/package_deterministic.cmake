# package.deterministic_across_processes: `kiln compile MODEL -o` twice, in two processes with two
# fresh kernel caches (so the kernels' shared object is built by g++ twice), gives byte-identical
# packages (docs/package.md, Determinism). mlp: loop kernels only; resnet18: oneDNN and loops.
# Usage: cmake -DKILN=<path to kiln> -P package_deterministic.cmake
string(RANDOM LENGTH 8 tag)
set(dir "$ENV{TMPDIR}")
if(NOT dir)
  set(dir /tmp)
endif()
set(dir "${dir}/kiln-pkg-determinism-${tag}")
foreach(model mlp resnet18)
  foreach(run a b)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env KILN_CACHE_DIR=${dir}/cache-${run}
                            ${KILN} compile ${model} -o ${dir}/${model}-${run}.kiln
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      file(REMOVE_RECURSE "${dir}")
      message(FATAL_ERROR "kiln compile ${model} (${run}) exited with ${rc}: ${err}")
    endif()
  endforeach()
  file(SHA256 ${dir}/${model}-a.kiln ha)
  file(SHA256 ${dir}/${model}-b.kiln hb)
  file(SIZE ${dir}/${model}-a.kiln size)
  message("${model}: ${size} bytes, sha256 ${ha} / ${hb}")
  if(NOT ha STREQUAL hb)
    file(REMOVE_RECURSE "${dir}")
    message(FATAL_ERROR "two compiles of ${model} with fresh caches gave different packages")
  endif()
endforeach()
file(REMOVE_RECURSE "${dir}")
