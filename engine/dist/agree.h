// Ranks that must run the same job check that they do, before they depend on it.
//
// Every rank lists the values that must agree (the subcommand, the resolved flags, the model and
// the data's identity) as name/value pairs. One small all-gather of a digest settles the usual case;
// when the digests differ, the texts themselves are gathered and every rank throws the same error
// naming the fields that differ and which ranks hold which value, so the job ends at once with a
// message instead of a collective that never matches (a hang, an MPI abort, or a silently wrong run).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "engine/dist/communicator.h"

namespace llmt {

using ConfigFields = std::vector<std::pair<std::string, std::string>>;

// Collective over `world`. `what` names the set in the message ("train configuration").
void check_ranks_agree(ControlComm& world, const std::string& what, const ConfigFields& fields);

// The message check_ranks_agree throws, from every rank's fields (public for the tests); "" when they agree.
std::string describe_disagreement(const std::string& what, const std::vector<ConfigFields>& by_rank);

}  // namespace llmt
