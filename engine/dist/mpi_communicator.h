// The MPI communicators. Only engine/dist includes MPI headers.
#pragma once
#include <memory>
#include <string>

#include "engine/dist/communicator.h"

namespace llmt {

// The control communicator over MPI_COMM_WORLD; MPI must be initialised (init_launch does it).
std::unique_ptr<ControlComm> make_mpi_world_control();
// The MPI library's own name and version (MPI_Get_library_version's first line).
std::string mpi_library_version();
// A data communicator over the same ranks as `control`, on its own duplicate of the MPI
// communicator (so data collectives in flight never interleave with control messages), for host
// buffers. Collective over `control`.
std::unique_ptr<DataComm> make_mpi_data_comm(ControlComm& control);

}  // namespace llmt
