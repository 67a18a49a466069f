// Ranks that must run the same job check that they do, before they depend on it; and an error on
// one rank becomes every rank's error at once (agree_or_throw), so none is left waiting in a
// collective the failing rank never joins.
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

// Throws, on every rank at once, when any rank's `ok` is false: the message is the lowest failing
// rank's `what`, prefixed with its rank when the world has more than one. Collective over `world`.
void agree_or_throw(ControlComm& world, bool ok, const std::string& what);

// The message check_ranks_agree throws, from every rank's fields (public for the tests); "" when they agree.
std::string describe_disagreement(const std::string& what, const std::vector<ConfigFields>& by_rank);

}  // namespace llmt
