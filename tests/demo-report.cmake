# What the demo's check scripts share (demo-chaos-check.cmake,
# demo-hosts-check.cmake), include()d by them.

# demo_report(<command> <exit status> <stdout> [<stderr>]): fails unless the
# command exited 0; its report, the last line of stdout (UCX prints its own
# errors on stdout, e.g. a shared-memory lane to a killed peer, before it),
# into `report`.
function(demo_report what rc out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} exited with ${rc}; its output:\n${out}\n${ARGN}")
  endif()
  string(STRIP "${out}" r)
  string(REGEX REPLACE "^.*\n" "" r "${r}")
  message(STATUS "report: ${r}")
  set(report "${r}" PARENT_SCOPE)
endfunction()

# expect(<EQ|GE> <json path...> VALUE): the member of `report` is a number
# equal to, or at least, VALUE.
function(expect op)
  list(POP_BACK ARGN want)
  string(JSON v ERROR_VARIABLE err GET "${report}" ${ARGN})
  if(err)
    message(FATAL_ERROR "the report has no ${ARGN}: ${err}")
  endif()
  if((op STREQUAL "EQ" AND NOT v EQUAL want) OR (op STREQUAL "GE" AND v LESS want))
    message(FATAL_ERROR "${ARGN} is ${v}, expected ${op} ${want}")
  endif()
endfunction()
