# cuda.no_device_is_clean: `kiln device` must exit 0 and print a recognised status line, on
# machines with or without a GPU. (A CTest PASS_REGULAR_EXPRESSION alone would ignore the exit
# code, hence this script.) Usage: cmake -DKILN=<path to kiln> -P check_device.cmake
execute_process(COMMAND ${KILN} device RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln device exited with ${rc}; expected 0 with or without a GPU")
endif()
if(NOT out MATCHES "no CUDA device|CUDA device\\(s\\)")
  message(FATAL_ERROR "kiln device printed no 'no CUDA device' or 'CUDA device(s)' line")
endif()
