// The data-parallel ranks of a run, through LibTorch's c10d: a TCPStore
// rendezvous from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; with
// TORCHELASTIC_USE_AGENT_STORE every rank is a client of the agent's store),
// ProcessGroupGloo for CPU tensors and ProcessGroupNCCL for CUDA tensors.
// Without those variables: one rank, and every collective is the identity
// (with them, a single rank still runs its collectives through c10d).
//
// Every collective has a name and the group's timeout: a rank that crashed
// or hangs makes the others throw DistributedError naming this rank, the
// collective and the timeout, instead of waiting forever.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class Backend;
class Store;
class Work;
} // namespace c10d

namespace dflex::runtime {

/// A collective that failed or timed out.
class DistributedError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// torchrun's description of this process.
struct RankEnvironment {
  int rank = 0, worldSize = 1, localRank = 0, localWorldSize = 1;
  std::string masterAddress = "127.0.0.1";
  int masterPort = 29500;
  bool agentStore = false; ///< TORCHELASTIC_USE_AGENT_STORE: the store's server is the agent
  /// Started by a launcher (WORLD_SIZE set): collectives go through c10d
  /// even for one rank.
  bool launched = false;

  /// Reads the variables; absent ones keep the single-rank defaults. Throws
  /// FormatError naming a variable that is malformed or inconsistent.
  static RankEnvironment fromEnvironment();
};

class DataParallel {
public:
  /// A group over `environment`'s ranks for tensors on `device` (Gloo on the
  /// CPU, NCCL on CUDA). Rendezvous and collectives fail after `timeout`.
  DataParallel(const RankEnvironment &environment, torch::Device device,
               std::chrono::milliseconds timeout);
  ~DataParallel();

  int rank() const { return environment_.rank; }
  int worldSize() const { return environment_.worldSize; }
  int localRank() const { return environment_.localRank; }
  const RankEnvironment &environment() const { return environment_; }
  /// Collectives go through c10d (several ranks, or a launcher's single rank).
  bool connected() const { return bool(backend_); }
  /// Ends the group after a run that went well (NCCL's resources released);
  /// a run that fails leaves it to the process's exit.
  void shutdown();

  /// Sums `tensors` (on the group's device) over the ranks, in place; the
  /// collectives of all tensors are in flight together.
  void sum(const std::vector<torch::Tensor> &tensors, const std::string &what);
  /// Starts summing `tensor` in place (from any thread, e.g. a backward's
  /// gradient hook); finishSums waits for every one started.
  void startSum(const torch::Tensor &tensor);
  void finishSums(const std::string &what);
  /// Scalar conveniences for what ranks must agree on.
  double sum(double value, const std::string &what);
  bool any(bool value, const std::string &what);
  /// Every rank's value, by rank.
  std::vector<double> gather(double value, const std::string &what);
  /// Every rank's `row` (1-D, the same length on all; values exact in
  /// float64, as bytes are), stacked by rank into a CPU tensor of its dtype.
  torch::Tensor gatherRows(const torch::Tensor &row, const std::string &what);

private:
  void wait(const std::vector<c10::intrusive_ptr<c10d::Work>> &works, const std::string &what);
  torch::Tensor scalar(double value) const;

  RankEnvironment environment_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::mutex startedMutex_;
  std::vector<c10::intrusive_ptr<c10d::Work>> started_;
};

} // namespace dflex::runtime
