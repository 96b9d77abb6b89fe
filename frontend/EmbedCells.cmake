# Writes OUTPUT: a C++ fragment with one {name, text} entry per .cell file in CELL_DIR, so the
# built-in cells ship inside the binary and stay ordinary files in cells/.
file(GLOB cells "${CELL_DIR}/*.cell")
list(SORT cells)
set(content "// Generated from cells/*.cell by frontend/EmbedCells.cmake. Do not edit.\n")
foreach(cell ${cells})
  get_filename_component(name "${cell}" NAME_WE)
  file(READ "${cell}" text)
  string(APPEND content "{\"${name}\", R\"rnnc_cell(${text})rnnc_cell\"},\n")
endforeach()
file(WRITE "${OUTPUT}.tmp" "${content}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUTPUT}.tmp" "${OUTPUT}")
