// A DataComm for device memory over a host-memory one (MPI): each collective copies its input to
// the host, runs there, and copies the result back, through the backend. It is how a GPU backend
// trains without NCCL, and how several ranks share one GPU (NCCL refuses that). Synchronous: the
// copy to the host waits for the compute stream, so nothing overlaps.
#pragma once
#include <memory>

#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"

namespace llmt {

std::unique_ptr<DataComm> make_staged_data_comm(std::unique_ptr<DataComm> host_comm, Backend& be);

}  // namespace llmt
