# Writes OUT, a header with the checkout's commit (git describe --always --dirty), only when it
# changed, so `llmt bench` can say exactly what ran without rebuilding on every configure.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit "unknown (not a git checkout)")
endif()
set(text "#pragma once\n#define LLMT_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
