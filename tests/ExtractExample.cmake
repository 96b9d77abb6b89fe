# Writes OUTPUT: the C++ code block of README that starts with `// rnnc-example`, so the README's
# example is compiled and run by the test suite and cannot go stale.
file(READ "${README}" text)
string(FIND "${text}" "```cpp\n// rnnc-example" start)
if(start EQUAL -1)
  message(FATAL_ERROR "README has no ```cpp block starting with // rnnc-example")
endif()
math(EXPR start "${start} + 7")
string(SUBSTRING "${text}" ${start} -1 rest)
string(FIND "${rest}" "```" end)
string(SUBSTRING "${rest}" 0 ${end} code)
file(WRITE "${OUTPUT}.tmp" "${code}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUTPUT}.tmp" "${OUTPUT}")
