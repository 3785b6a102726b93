#include "dflex/runtime/distributed/DataParallel.h"

#include "dflex/Support/Error.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef DFLEX_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <string>

namespace dflex::runtime {

namespace {

std::optional<std::string> variable(const char *name) {
  const char *value = std::getenv(name);
  if (!value || !*value)
    return std::nullopt;
  return std::string(value);
}

int integerVariable(const char *name, int fallback) {
  const std::optional<std::string> text = variable(name);
  if (!text)
    return fallback;
  try {
    size_t used = 0;
    const int value = std::stoi(*text, &used);
    if (used == text->size() && value >= 0)
      return value;
  } catch (const std::exception &) {
  }
  throw FormatError("environment: " + std::string(name) + "='" + *text +
                    "' is not a non-negative integer");
}

} // namespace

RankEnvironment RankEnvironment::fromEnvironment() {
  RankEnvironment e;
  e.rank = integerVariable("RANK", 0);
  e.worldSize = integerVariable("WORLD_SIZE", 1);
  e.localRank = integerVariable("LOCAL_RANK", 0);
  e.localWorldSize = integerVariable("LOCAL_WORLD_SIZE", 1);
  e.masterAddress = variable("MASTER_ADDR").value_or(e.masterAddress);
  e.masterPort = integerVariable("MASTER_PORT", e.masterPort);
  const std::optional<std::string> agent = variable("TORCHELASTIC_USE_AGENT_STORE");
  e.agentStore = agent && (*agent == "True" || *agent == "true" || *agent == "1");
  e.launched = variable("WORLD_SIZE").has_value();
  if (e.worldSize < 1 || e.rank >= e.worldSize)
    throw FormatError("environment: RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" +
                      std::to_string(e.worldSize));
  if (e.localWorldSize < 1 || e.localRank >= e.localWorldSize)
    throw FormatError("environment: LOCAL_RANK=" + std::to_string(e.localRank) +
                      " is not below LOCAL_WORLD_SIZE=" + std::to_string(e.localWorldSize));
  return e;
}

DataParallel::DataParallel(const RankEnvironment &environment, torch::Device device,
                           std::chrono::milliseconds timeout)
    : environment_(environment), device_(device), timeout_(timeout) {
  if (!environment_.launched && environment_.worldSize == 1)
    return;
  const std::string where = "rank " + std::to_string(rank()) + " of " + std::to_string(worldSize());
  try {
    c10d::TCPStoreOptions options;
    options.port = uint16_t(environment_.masterPort);
    options.isServer = !environment_.agentStore && rank() == 0;
    options.numWorkers = worldSize();
    options.timeout = timeout_;
    store_ = c10::make_intrusive<c10d::PrefixStore>(
        "dflex", c10::make_intrusive<c10d::TCPStore>(environment_.masterAddress, options));
    if (device_.is_cuda()) {
#ifdef DFLEX_WITH_NCCL
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = timeout_;
      backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, rank(), worldSize(), nccl);
#else
      throw DistributedError(where + ": this build has no NCCL");
#endif
    } else {
      auto gloo = c10d::ProcessGroupGloo::Options::create();
      gloo->timeout = timeout_;
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank(), worldSize(), gloo);
    }
  } catch (const DistributedError &) {
    throw;
  } catch (const std::exception &error) {
    throw DistributedError(where + ": the rendezvous at " + environment_.masterAddress + ":" +
                           std::to_string(environment_.masterPort) + " failed: " + error.what());
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::shutdown() {
  if (backend_)
    backend_->shutdown();
  backend_.reset();
}

void DataParallel::wait(const std::vector<c10::intrusive_ptr<c10d::Work>> &works,
                        const std::string &what) {
  try {
    for (const auto &work : works)
      if (!work->wait(timeout_))
        throw std::runtime_error("not completed");
  } catch (const std::exception &error) {
    throw DistributedError("rank " + std::to_string(rank()) + " of " + std::to_string(worldSize()) +
                           ": the collective '" + what + "' failed or did not finish within " +
                           std::to_string(timeout_.count() / 1000) +
                           " s (another rank crashed, hangs, or stopped): " + error.what());
  }
}

void DataParallel::sum(const std::vector<torch::Tensor> &tensors, const std::string &what) {
  if (!backend_)
    return;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const torch::Tensor &tensor : tensors) {
    std::vector<at::Tensor> one = {tensor};
    works.push_back(backend_->allreduce(one));
  }
  wait(works, what);
}

void DataParallel::startSum(const torch::Tensor &tensor) {
  if (!backend_)
    return;
  std::vector<at::Tensor> one = {tensor};
  c10::intrusive_ptr<c10d::Work> work = backend_->allreduce(one);
  std::lock_guard<std::mutex> lock(startedMutex_);
  started_.push_back(std::move(work));
}

void DataParallel::finishSums(const std::string &what) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(startedMutex_);
    works.swap(started_);
  }
  wait(works, what);
}

torch::Tensor DataParallel::gatherRows(const torch::Tensor &row, const std::string &what) {
  if (!backend_)
    return row.cpu().unsqueeze(0);
  torch::Tensor rows = torch::zeros({worldSize(), row.numel()}, torch::TensorOptions(torch::kDouble).device(device_));
  rows[rank()].copy_(row.flatten().to(torch::kDouble));
  sum({rows}, what);
  return rows.cpu().to(row.scalar_type());
}

torch::Tensor DataParallel::scalar(double value) const {
  return torch::tensor({value}, torch::TensorOptions(torch::kDouble).device(device_));
}

double DataParallel::sum(double value, const std::string &what) {
  if (!backend_)
    return value;
  torch::Tensor t = scalar(value);
  sum({t}, what);
  return t.item<double>();
}

bool DataParallel::any(bool value, const std::string &what) {
  return sum(value ? 1.0 : 0.0, what) > 0;
}

std::vector<double> DataParallel::gather(double value, const std::string &what) {
  if (!backend_)
    return {value};
  // Each rank fills its own slot of a zero vector; the sum is everyone's.
  torch::Tensor slots = torch::zeros({worldSize()}, torch::TensorOptions(torch::kDouble).device(device_));
  slots[rank()] = value;
  sum({slots}, what);
  const torch::Tensor host = slots.cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + worldSize());
}

} // namespace dflex::runtime
