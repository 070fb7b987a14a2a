// InProcessCommunicator: the Communicator of N ranks that live in one process as threads, each
// with its own CPU backend (host memory). It is how CI runs tensor parallelism without GPUs.
//
// A collective is two rendezvous of all ranks: at the first every rank publishes its buffer;
// between them each rank computes a disjoint slice of the result from every rank's buffer and
// writes it into every rank's output; the second ensures all writes are done before anyone
// returns (and reuses its buffer). AllReduceSum adds in rank order, ((x0 + x1) + x2) + ..., for
// every element, whichever rank computes it: the result is deterministic and bit-identical on
// every rank.
#pragma once

#include <memory>
#include <vector>

#include "backend/communicator.h"

namespace sieve {

// The communicators of `size` ranks sharing one group; element r is rank r's. Each must be used
// from one thread at a time, and every rank must take part in every collective.
std::vector<std::unique_ptr<Communicator>> MakeInProcessCommunicators(int size);

}  // namespace sieve
