#!/usr/bin/env bash
# Packs llmt for a bare GPU machine: one with the NVIDIA driver and the CUDA toolkit but none of the
# Debian packages llmt builds with (MPI, HDF5, oneDNN, ...), as the lent H200 is. Builds build-gpu/
# here for sm_90 (nvcc compiles without a GPU) and writes .gpu/bundle.tar.xz (ignored by git) holding:
#   bin/    llmt and llmt_gpu_tests, each behind a wrapper that starts it with the bundled glibc loader
#           (so the other machine's glibc version does not matter)
#   lib/    every shared library they load except the CUDA ones (cudart, cuBLASLt, NCCL: the other
#           machine's toolkit and its Python nvidia-* packages provide those), and Open MPI's components
#   env.sh  what to source there (scripts/gpu_env.sh): where the machine's CUDA libraries are, and Open
#           MPI as an isolated singleton (no mpirun)
# scripts/gpu_selftest.sh --bundle unpacks and uses it. .gpu/ is ignored by git and carried by the
# device tool (`carry: [".gpu"]`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${LLMT_CUDA_ARCH:-90}" \
  > /dev/null
ninja -C build-gpu llmt llmt_gpu_tests

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/real" "$stage/lib"
progs=(llmt llmt_gpu_tests)
for p in "${progs[@]}"; do cp "build-gpu/bin/$p" "$stage/real/"; done

# Open MPI's components (dlopened at MPI_Init), then the libraries of everything, CUDA's left out
ompi_libdir=$(dirname "$(readlink -f "$(ldd build-gpu/bin/llmt | awk '/libmpi\.so/ {print $3}')")")
ompi_components=$(find "$ompi_libdir" /usr/lib/x86_64-linux-gnu/openmpi -maxdepth 2 -type d -name 'openmpi3' 2>/dev/null | head -1)
[ -n "$ompi_components" ] || { echo "gpu_bundle: Open MPI's component folder not found" >&2; exit 1; }
cp -r "$ompi_components" "$stage/lib/openmpi"
cuda_lib='libcuda\.so|libcudart|libcublas|libnccl|libnvidia'
deps() { ldd "$@" 2>/dev/null | awk '$3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u; }
mapfile -t libs < <(deps "$stage"/real/* "$stage"/lib/openmpi/*.so | grep -v -E "$cuda_lib")
for l in "${libs[@]}"; do cp -L "$l" "$stage/lib/"; done
loader=$(ldd build-gpu/bin/llmt | awk '/ld-linux/ {print $1}')
cp -L "$loader" "$stage/lib/ld-linux.so"
mkdir -p "$stage/share" && cp -r /usr/share/openmpi "$stage/share/openmpi"  # its messages (OPAL_PREFIX/share/openmpi)

for p in "${progs[@]}"; do
  cat > "$stage/bin/$p" <<EOF
#!/usr/bin/env bash
here="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")/.." && pwd)"
# the bundle's libraries first, then env.sh's LLMT_CUDA_LIBS (driver, toolkit, wheels, LD_LIBRARY_PATH)
exec "\$here/lib/ld-linux.so" --library-path "\$here/lib\${LLMT_CUDA_LIBS:+:\$LLMT_CUDA_LIBS}" "\$here/real/$p" "\$@"
EOF
  chmod +x "$stage/bin/$p"
done
cp scripts/gpu_env.sh "$stage/env.sh"
mkdir -p .gpu
tar -cJf .gpu/bundle.tar.xz -C "$stage" .
echo "gpu_bundle: .gpu/bundle.tar.xz, $(du -h .gpu/bundle.tar.xz | cut -f1) ($(ls "$stage/lib" | wc -l) libraries)"
