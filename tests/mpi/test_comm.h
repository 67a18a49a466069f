// The data communicator of the multi-rank tests: MPI (staged through host memory for a device
// backend), or for a device backend NCCL with LLMT_TEST_COMM=nccl (in the emulated build, the
// stand-in over MPI), so the same equivalence tables check both. CPU reference runs stay on MPI.
#pragma once
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/staged_comm.h"
#include "kernels/cuda/cuda_backend.h"

inline std::unique_ptr<llmt::DataComm> make_test_data_comm(llmt::ControlComm& comm, llmt::Backend& be) {
  const char* which = std::getenv("LLMT_TEST_COMM");
  if (which && std::string(which) == "nccl" && !be.is_host_memory()) return llmt::make_nccl_data_comm(comm, be, 120.0);
  std::unique_ptr<llmt::DataComm> data = llmt::make_mpi_data_comm(comm);
  if (!be.is_host_memory()) data = llmt::make_staged_data_comm(std::move(data), be);
  return data;
}
