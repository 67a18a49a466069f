# Sourced on the GPU machine: scripts/gpu_bundle.sh packs it as the bundle's env.sh, and
# scripts/gpu_selftest.sh --bundle sources it from there. Sets LLMT_CUDA_LIBS, the folders the
# bundle's wrappers search after the bundle's own lib/ (so the machine's CUDA, driver and NCCL are
# used, never ours), in this order:
#   the driver's (libcuda.so.1, libnvidia-ml.so.1): /usr/local/nvidia/lib64 and lib, where the lent
#     machines mount it; the loader's cache and default folders come after everything listed here
#   the CUDA toolkit's: /usr/local/cuda/lib64, lib, targets/x86_64-linux/lib
#   Python's nvidia-* wheels: every nvidia/<name>/lib under a folder of python3's sys.path (CUDA 13's
#     wheels share nvidia/cu13/lib; NCCL's is nvidia/nccl/lib, cuDNN's nvidia/cudnn/lib; CUDA 12's
#     nvidia/cublas/lib, nvidia/cuda_runtime/lib, ...)
#   LD_LIBRARY_PATH as it was
# and Open MPI as an isolated singleton (no mpirun there).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
llmt_cuda_libs=""
llmt_add_lib_dir() {  # a folder that exists, once
  [ -d "$1" ] || return 0
  case ":$llmt_cuda_libs:" in *":$1:"*) return 0 ;; esac
  llmt_cuda_libs="${llmt_cuda_libs:+$llmt_cuda_libs:}$1"
}
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/lib \
         /usr/local/cuda/targets/x86_64-linux/lib; do
  llmt_add_lib_dir "$d"
done
while IFS= read -r wheels; do
  for d in "$wheels"/*/lib; do llmt_add_lib_dir "$d"; done
done < <(python3 -c 'import os, sys
for p in sys.path:
    d = os.path.join(p or ".", "nvidia")
    if os.path.isdir(d): print(os.path.abspath(d))' 2>/dev/null)
export LLMT_CUDA_LIBS="$llmt_cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset llmt_cuda_libs
export OMPI_MCA_ess_singleton_isolated=1          # MPI_Init without mpirun or orted
export OMPI_MCA_mca_base_component_path="$here/lib/openmpi"
export OPAL_PREFIX="$here" OMPI_MCA_mca_base_param_files=/dev/null
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_coll=^hcoll OMPI_MCA_mtl=^ofi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "bundle: $here; libraries after its own: $LLMT_CUDA_LIBS"
