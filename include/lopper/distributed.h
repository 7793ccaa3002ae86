// Data-parallel communication over processes (and machines) with PyTorch's own engine, c10d:
// rendezvous through a TCPStore that rank 0 hosts, then Gloo (cpu) or NCCL (cuda) collectives.
//
// Collective contract: every rank calls the same collectives in the same order, each with the same
// list of tensors (same order, shapes, dtypes and devices; an undefined tensor in the same slots).
// A rank that breaks it, dies or hangs makes the others throw lopper::Error within timeout_s.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace lopper {

struct DistOptions {
  int rank = 0, world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string device = "cpu";  // "cpu" -> Gloo, "cuda" or "cuda:N" -> NCCL
  double timeout_s = 120;      // any collective or rendezvous that waits longer fails
};

/// Options from the torchrun environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and
/// LOCAL_RANK, which turns device "cuda" into "cuda:LOCAL_RANK". world = 1 (no network) when
/// WORLD_SIZE is unset or 1. Throws lopper::Error ("[dist] ...") for a malformed or out-of-range
/// value, or a device other than cpu, cuda, cuda:N.
DistOptions dist_options_from_env(const std::string& device);

/// One process's membership in a data-parallel group. With world = 1 every call is a no-op and
/// nothing touches the network. Errors (rendezvous, a peer that died or timed out) throw
/// lopper::Error with one line naming this rank and the peer or address; after one, the group is
/// unusable and every later call says so. Call it from one thread.
class Distributed {
 public:
  /// Rendezvous: rank 0 hosts a c10d::TCPStore on master_port and waits for all ranks; the others
  /// connect to master_addr:master_port. Then the Gloo or NCCL process group connects every pair.
  /// Blocks until all ranks have joined or timeout_s has passed.
  explicit Distributed(const DistOptions& o);
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const;
  int world() const;
  bool is_main() const { return rank() == 0; }
  const DistOptions& options() const;

  /// Averages floating-point tensors over ranks in place (sum / world): gradients. Tensors are
  /// coalesced into one flat buffer per (device, dtype) in first-seen order, so there is one
  /// collective per buffer, not one per tensor. Undefined tensors are skipped.
  void allreduce_mean(std::vector<at::Tensor>& tensors);
  /// Sums in place (metrics: loss sums, correct counts); any dtype Gloo/NCCL reduce, integers too.
  void allreduce_sum(std::vector<at::Tensor>& tensors);
  /// Copies rank `root`'s tensors into every other rank's (initial weights); coalesced like
  /// allreduce. Tensors that require grad are written without recording autograd history.
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
  /// Returns once every rank has called it.
  void barrier();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lopper
