# Extracts every ```cpp block of README.md into its own source file, so a
# test builds each one against frugal: the README's examples are code that
# compiles, not prose that drifts (its model example once called a
# step.plan().summary() that did not exist).
# frugal_readme_blocks(<readme> <out_dir> <var>): <var> gets the files written.
function(frugal_readme_blocks readme out_dir var)
  file(READ "${readme}" text)
  set(files)
  set(n 0)
  while(TRUE)
    string(FIND "${text}" "```cpp\n" start)
    if(start EQUAL -1)
      break()
    endif()
    math(EXPR start "${start} + 7")
    string(SUBSTRING "${text}" ${start} -1 text)
    string(FIND "${text}" "\n```" end)
    if(end EQUAL -1)
      message(FATAL_ERROR "${readme}: a ```cpp block is never closed")
    endif()
    string(SUBSTRING "${text}" 0 ${end} code)
    string(SUBSTRING "${text}" ${end} -1 text)
    math(EXPR n "${n} + 1")
    set(file "${out_dir}/readme_block_${n}.cpp")
    file(CONFIGURE OUTPUT "${file}" CONTENT "// Block ${n} of README.md, extracted by tests/readme_blocks.cmake.\n${code}\n" @ONLY)
    list(APPEND files "${file}")
  endwhile()
  set(${var} ${files} PARENT_SCOPE)
endfunction()
