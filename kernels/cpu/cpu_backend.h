// The CPU backend (engine/backend/backend.h): OpenMP across rows, heads or channels.
#pragma once
#include <memory>

#include "engine/backend/backend.h"

namespace llmt {

// threads <= 0 means every core OpenMP reports.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace llmt
