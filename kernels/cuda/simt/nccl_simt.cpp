// NCCL's calls over MPI for the emulated build (nccl_simt.h says what this is for and what it
// cannot show).
#include "kernels/cuda/simt/simt.h"

#include "kernels/cuda/simt/nccl_simt.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/diag/nccl_log.h"
#include "engine/dist/mpi_communicator.h"

struct ncclComm {
  std::unique_ptr<llmt::DataComm> mpi;  // a duplicate of the MPI communicator of the same ranks
  int rank = 0, nranks = 1, world_rank = 0;
  std::atomic<int> pending_polls{0};  // ncclInProgress answers left after a nonblocking init or split
  std::atomic<int> async{ncclSuccess};
  std::string last_error;
};

namespace {

using llmt::DType;

std::atomic<long long> g_collectives{0};  // this process's collectives, for LLMT_SIMT_NCCL_FAIL

bool to_dtype(ncclDataType_t t, DType* out) {
  switch (t) {
    case ncclFloat32: *out = DType::f32; return true;
    case ncclBfloat16: *out = DType::bf16; return true;
    case ncclInt32: *out = DType::i32; return true;
    case ncclFloat64: *out = DType::f64; return true;
    default: return false;
  }
}

bool to_op(ncclRedOp_t op, llmt::ReduceOp* out) {
  if (op == ncclSum) *out = llmt::ReduceOp::sum;
  else if (op == ncclAvg) *out = llmt::ReduceOp::avg;
  else return false;
  return true;
}

ncclResult_t misuse(ncclComm_t comm, const std::string& what) {
  if (comm) comm->last_error = what;
  return ncclInvalidUsage;
}

// LLMT_SIMT_NCCL_FAIL=rank:n: that world rank's n-th collective fails asynchronously and never ends.
bool injected_failure(ncclComm_t comm) {
  const long long n = ++g_collectives;
  const char* f = std::getenv("LLMT_SIMT_NCCL_FAIL");
  int rank = -1;
  long long at = -1;
  if (!f || std::sscanf(f, "%d:%lld", &rank, &at) != 2 || rank != comm->world_rank || n != at) return false;
  comm->last_error = "injected failure (LLMT_SIMT_NCCL_FAIL): the peer's connection was reset";
  comm->async = ncclRemoteError;
  // As NCCL's kernel spins on a peer that is gone: only the watchdog (which sees the asynchronous
  // error) ends this.
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *x = (const char*)a, *y = (const char*)b;
  return x < y + b_bytes && y < x + a_bytes;
}

ncclComm_t new_comm(std::unique_ptr<llmt::DataComm> mpi, int world_rank, const ncclConfig_t* config) {
  ncclComm_t c = new ncclComm;
  c->rank = mpi->rank();
  c->nranks = mpi->size();
  c->world_rank = world_rank;
  c->mpi = std::move(mpi);
  c->pending_polls = config && !config->blocking ? 1 : 0;
  return c;
}

// With NCCL_DEBUG=INFO and NCCL_DEBUG_FILE, NCCL logs its version and every channel's transport;
// the stand-in logs the same kinds of line, in NCCL's format, saying what it is (MPI within one
// host), so the trainer's transport report runs in the emulated build too.
void log_like_nccl(const ncclComm* c) {
  const char* debug = std::getenv("NCCL_DEBUG");
  const char* file = std::getenv("NCCL_DEBUG_FILE");
  if (!debug || std::string(debug) != "INFO" || !file || !*file) return;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string path = llmt::expand_nccl_debug_file(file, host, (int)getpid());
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return;
  const std::string prefix = llmt::strformat("%s:%d:%d [0] NCCL INFO ", host, (int)getpid(), (int)getpid());
  std::fprintf(f, "%sNCCL version 0.0.0+llmt-simt-stand-in\n", prefix.c_str());
  if (c->nranks > 1)
    std::fprintf(f, "%sChannel 00/0 : %d[0] -> %d[0] via SHM/llmt-stand-in-over-MPI\n", prefix.c_str(), c->rank,
                 (c->rank + 1) % c->nranks);
  std::fprintf(f, "%scomm %p rank %d nranks %d cudaDev 0 busId 0 - Init COMPLETE\n", prefix.c_str(), (const void*)c,
               c->rank, c->nranks);
  std::fclose(f);
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  *version = 0;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& c : id->internal) c = (char)rd();
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  // The stand-in's communicators span MPI_COMM_WORLD (as the trainer's first one does); narrower
  // ones come from ncclCommSplit.
  std::unique_ptr<llmt::ControlComm> world = llmt::make_mpi_world_control();
  if (nranks != world->size() || rank != world->rank()) return misuse(nullptr, "the stand-in spans MPI_COMM_WORLD");
  std::vector<ncclUniqueId> ids((size_t)nranks);
  world->all_gather(&id, ids.data(), sizeof(id) / 4, DType::i32);
  for (const ncclUniqueId& other : ids)
    if (std::memcmp(&other, &ids[0], sizeof(id)) != 0) return misuse(nullptr, "the ranks passed different unique ids");
  *comm = new_comm(llmt::make_mpi_data_comm(*world), world->rank(), config);
  log_like_nccl(*comm);
  return (*comm)->pending_polls ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (color < 0) return misuse(comm, "the stand-in has no NCCL_SPLIT_NOCOLOR");
  *newcomm = new_comm(comm->mpi->split(color, key), comm->world_rank, config);
  return (*newcomm)->pending_polls ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  int left = comm->pending_polls.load();
  if (left > 0 && comm->pending_polls.compare_exchange_strong(left, left - 1)) {
    *state = ncclInProgress;
    return ncclSuccess;
  }
  *state = (ncclResult_t)comm->async.load();
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

// Called from the watchdog's thread while another may be blocked in MPI on this communicator: it
// only marks it, and the process exits right after (freeing it under that thread would crash it).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm) comm->async = ncclRemoteError;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : ""; }

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t) {
  DType t;
  if (!to_dtype(datatype, &t)) return misuse(comm, "datatype");
  if (injected_failure(comm)) return ncclSuccess;
  const size_t bytes = sendcount * llmt::dtype_size(t);
  llmt::simt::HostAccess open;
  std::vector<char> copy;
  if (overlaps(sendbuff, bytes, recvbuff, bytes * comm->nranks)) {  // in place: MPI wants its own send buffer
    copy.assign((const char*)sendbuff, (const char*)sendbuff + bytes);
    sendbuff = copy.data();
  }
  comm->mpi->all_gather(sendbuff, recvbuff, (int64_t)sendcount, t);
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  DType t;
  llmt::ReduceOp rop;
  if (!to_dtype(datatype, &t) || !to_op(op, &rop)) return misuse(comm, "datatype or reduction");
  if (injected_failure(comm)) return ncclSuccess;
  const size_t bytes = recvcount * llmt::dtype_size(t);
  llmt::simt::HostAccess open;
  std::vector<char> copy;
  if (overlaps(sendbuff, bytes * comm->nranks, recvbuff, bytes)) {
    copy.assign((const char*)sendbuff, (const char*)sendbuff + bytes * comm->nranks);
    sendbuff = copy.data();
  }
  comm->mpi->reduce_scatter(sendbuff, recvbuff, (int64_t)recvcount, t, rop);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t) {
  DType t;
  llmt::ReduceOp rop;
  if (!to_dtype(datatype, &t) || !to_op(op, &rop)) return misuse(comm, "datatype or reduction");
  if (injected_failure(comm)) return ncclSuccess;
  llmt::simt::HostAccess open;
  if (sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, count * llmt::dtype_size(t));
  comm->mpi->all_reduce(recvbuff, (int64_t)count, t, rop);
  return ncclSuccess;
}
