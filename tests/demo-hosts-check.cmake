# `kvcr demo --hosts 3 --quick --json`, checked: run by ctest as
#   cmake -DKVCR=<kvcr binary> -P demo-hosts-check.cmake
#
# Pinned: the router and two engines ran on three netns rig hosts and the
# report says so; blocks were pulled from a peer, so bytes crossed the rig's
# links (shared memory cannot reach another rig host); no delivered byte
# was wrong; every engine reported after the drain and none leaked. When the
# rig cannot run here (not root) kvcr exits 77 and this script prints
# "demo-hosts: skipped: <why>", which ctest takes as a skip.
cmake_minimum_required(VERSION 3.20)

execute_process(
  COMMAND ${KVCR} demo --hosts 3 --quick --json
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  RESULT_VARIABLE rc)
if(rc EQUAL 77)
  string(STRIP "${err}" err)
  message(STATUS "demo-hosts: skipped: ${err}")
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/demo-report.cmake)
demo_report("kvcr demo --hosts 3" "${rc}" "${out}" "${err}")

expect(EQ hosts 3)
expect(EQ engines 2)
expect(EQ engines_reported 2)
expect(EQ wrong_bytes 0)
expect(EQ leaks 0)
expect(EQ requests 60)
expect(GE remote_g2_pulled 1)
expect(GE peer_bytes 65536)
expect(GE verified_blocks 1)
# Where the pulls' time went: every pull a peer answered is split in parts.
expect(GE pull_split pulls 1)
expect(GE pull_split pull_data 0.000000001)
