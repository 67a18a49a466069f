// The CPU stand-in for NCCL in the emulated build: the part of nccl.h that kernels/cuda/nccl_comm.cu
// calls, with NCCL's names, values and semantics, carried out over MPI on the emulator's device
// buffers (host memory). It lets the NCCL communicator's own code (bootstrap over MPI, nonblocking
// init and split with polling, the communication stream and its events, averaging, the watchdog's
// error probe and abort) run in ctest. What it cannot show: NCCL's kernels, its transports and its
// timing; those are checked on a GPU (scripts/gpu_selftest.sh).
//
// Collectives run to completion inside the call (the emulator's streams are synchronous), so a
// peer that never arrives blocks the caller in MPI, where the watchdog sees it as on a GPU.
// Nonblocking communicators report ncclInProgress once after init and split, so the polling path
// runs. LLMT_SIMT_NCCL_FAIL=rank:n makes that rank's n-th collective (from 1) report an
// asynchronous ncclRemoteError and never return, as a kernel waiting on a dead peer, for the
// watchdog's tests.
#pragma once
#include <cstddef>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

// Only the field llmt sets; NCCL's has more.
typedef struct {
  int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_MAJOR 0
#define NCCL_MINOR 0
#define NCCL_PATCH 0

struct ncclComm;
typedef struct ncclComm* ncclComm_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
