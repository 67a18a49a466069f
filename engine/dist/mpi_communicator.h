// The MPI Communicator (host buffers). Only engine/dist includes MPI headers.
#pragma once
#include <memory>

#include "engine/dist/communicator.h"

namespace llmt {

// A communicator over MPI_COMM_WORLD; MPI must be initialised (init_launch does it).
std::unique_ptr<Communicator> make_mpi_world_communicator();

}  // namespace llmt
