# package.threads_at_load: a package written for two OpenMP threads, benched by a process that
# asks for one (`kiln bench P.kiln --threads 1`): its oneDNN nodes are built for one thread at
# load (Note [oneDNN threads at load] in src/runtime/launch_library.cc), and the timed calls keep
# one core busy (`cpu_busy_cores`: process CPU time over wall time; a single-threaded process
# cannot exceed 1 but for the clock's grain). Before, such a package forked two threads in every
# oneDNN convolution (2.0 cores busy). With `--threads 2` it keeps the written count.
# Usage: cmake -DKILN=<path to kiln> -P package_threads.cmake
string(RANDOM LENGTH 8 tag)
set(dir "$ENV{TMPDIR}")
if(NOT dir)
  set(dir /tmp)
endif()
set(dir "${dir}/kiln-pkg-threads-${tag}")
file(MAKE_DIRECTORY "${dir}")
function(fail msg)
  file(REMOVE_RECURSE "${dir}")
  message(FATAL_ERROR "${msg}")
endfunction()
execute_process(COMMAND ${KILN} compile resnet18 --threads 2 -o ${dir}/r18.kiln
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  fail("kiln compile resnet18 --threads 2 exited with ${rc}: ${err}")
endif()
foreach(threads 1 2)
  execute_process(COMMAND ${KILN} bench ${dir}/r18.kiln --threads ${threads} --iters 20 --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    fail("kiln bench r18.kiln --threads ${threads} exited with ${rc}: ${err}")
  endif()
  string(JSON built GET "${out}" package_onednn_threads)
  string(JSON kept GET "${out}" package_nodes_at_written_threads)
  string(JSON busy GET "${out}" cpu_busy_cores)
  message("--threads ${threads}: oneDNN nodes built for ${built} threads (${kept} kept the "
          "written 2), ${busy} cores busy")
  if(NOT built EQUAL threads)
    fail("--threads ${threads}: the package's oneDNN nodes were built for ${built} threads: ${out}")
  endif()
  if(threads EQUAL 1 AND busy GREATER 1.2)
    fail("--threads 1 kept ${busy} cores busy: the package ran threads the caller did not ask for")
  endif()
  if(busy LESS_EQUAL 0)
    fail("cpu_busy_cores ${busy}: no CPU time measured over the timed calls: ${out}")
  endif()
endforeach()
file(REMOVE_RECURSE "${dir}")
