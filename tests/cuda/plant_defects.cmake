# Copies of the project's CUDA sources with four defects planted by text, for tests/cuda/planted_test.cpp
# (which says what each is and what must catch it). Run by CMakeLists.txt as
#   cmake -DSRC=<source dir> -DOUT=<folder> -P plant_defects.cmake
# A snippet that is no longer in its source stops the build: a planted test must never quietly stop
# planting its defect.

# Replaces `before` with `after` in the variable `var`, which holds kernels/cuda/<file>.
macro(plant var file before after)
  string(FIND "${${var}}" "${before}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "plant_defects.cmake: kernels/cuda/${file} no longer holds the snippet to plant a defect in; "
                        "update tests/cuda/plant_defects.cmake and tests/cuda/planted_test.cpp:\n${before}")
  endif()
  string(REPLACE "${before}" "${after}" ${var} "${${var}}")
endmacro()

file(READ ${SRC}/kernels/cuda/flash_attention.cu flash)
file(READ ${SRC}/kernels/cuda/cuda_ops.cu ops)
file(READ ${SRC}/kernels/cuda/mma_probe.cu probe)

# 1. flash forward: no barrier between a K/V tile's copies landing and the warps reading it
plant(flash flash_attention.cu
  "    __syncthreads();  // this tile, from every thread's copies\n"
  "")
# 2. column partial sums: no barrier before the first row lane reads the others' partials
plant(ops cuda_ops.cu
  "  __syncthreads();\n  if (ry != 0 || c >= C) return;\n"
  "  if (ry != 0 || c >= C) return;\n")
# 3. the ldmatrix probe: no __syncwarp between the lanes' stores and the ldmatrix that reads them
plant(probe mma_probe.cu
  "  for (int i = l; i < n * 64; i += WARP_SIZE) sm[i] = m[i];\n  __syncwarp();\n"
  "  for (int i = l; i < n * 64; i += WARP_SIZE) sm[i] = m[i];\n")
# 4. block sums: one slot past the warps' partials, which no thread wrote, read too
plant(ops cuda_ops.cu
  "  A r = 0;\n  for (int i = 0; i < nw; i++) r += partial[i];\n"
  "  A r = 0;\n  for (int i = 0; i < nw + 1 && i < WARP_SIZE; i++) r += partial[i];\n")

file(WRITE ${OUT}/flash_attention.cu "${flash}")
file(WRITE ${OUT}/cuda_ops.cu "${ops}")
file(WRITE ${OUT}/mma_probe.cu "${probe}")
# the emulated build's one translation unit, with the planted copies in place of the originals
file(READ ${SRC}/kernels/cuda/simt/kernels.cpp units)
foreach(f flash_attention.cu cuda_ops.cu mma_probe.cu)
  string(REPLACE "#include \"kernels/cuda/${f}\"" "#include \"${OUT}/${f}\"" units "${units}")
endforeach()
file(WRITE ${OUT}/kernels.cpp "${units}")
