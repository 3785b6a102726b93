// dflex-eval: the acceptance length of a DFlash drafter under greedy
// speculative decoding with its target, on prompts of token ids or chat
// records; checks that the output is the target's own greedy decoding and
// times both.
#include "dflex/Support/Error.h"
#include "dflex/Support/Json.h"
#include "dflex/runtime/data/ChatData.h"
#include "dflex/runtime/eval/SpeculativeDecoding.h"
#include "dflex/runtime/support/FileIo.h"

#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

using namespace dflex::runtime;

namespace {

void synchronize(torch::Device device) {
  if (device.is_cuda())
    torch::cuda::synchronize(device.index());
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"dflex-eval: a DFlash drafter's acceptance length under greedy speculative decoding"};
  std::string targetDir, drafterDir, promptsPath, outPath, deviceName = "cpu", dtypeName = "bfloat16";
  int64_t maxNewTokens = 128;
  std::vector<int64_t> stopTokens;
  app.add_option("--target", targetDir, "the target's Hugging Face model directory")->required();
  app.add_option("--drafter", drafterDir, "a drafter checkpoint directory (dflex-train's or a public DFlash one)")
      ->required();
  app.add_option("--prompts", promptsPath,
                 "JSONL of prompts: {\"input_ids\": [...]}, or chat records ({\"messages\"} or "
                 "{\"conversations\"}, answered after their last user turn, through the target's chat template)")
      ->required();
  app.add_option("--max-new-tokens", maxNewTokens, "tokens generated per prompt at most");
  const CLI::Option *stopOption = app.add_option("--stop", stopTokens, "token ids that end a response (kept; default: the target's eos_token_id)");
  app.add_option("--device", deviceName, "cpu, cuda or cuda:N");
  app.add_option("--dtype", dtypeName, "bfloat16, float32 or float64")
      ->check(CLI::IsMember({"bfloat16", "float32", "float64"}));
  app.add_option("--out", outPath, "also write the results as JSON here");
  CLI11_PARSE(app, argc, argv);

  try {
    const torch::Device device(deviceName);
    const torch::ScalarType dtype = dtypeName == "bfloat16" ? torch::kBFloat16
                                    : dtypeName == "float32" ? torch::kFloat
                                                             : torch::kDouble;
    models::TargetModelOptions options;
    options.dtype = dtype;
    options.device = device;
    const models::TargetModel target = models::TargetModel::load(targetDir, options);
    const auto drafter = models::DFlashDrafterImpl::load(drafterDir, dtype, device);
    drafter->setTargetWeights(target.embedTokens(), target.lmHead());
    const std::vector<std::vector<int64_t>> prompts = readPrompts(promptsPath, targetDir, target.config().vocabSize);
    eval::GenerationOptions generation;
    generation.maxNewTokens = maxNewTokens;
    generation.stopTokens = stopOption->count() ? stopTokens : target.config().eosTokenIds;

    using Clock = std::chrono::steady_clock;
    std::vector<eval::Generation> generations;
    double speculativeSeconds = 0, targetSeconds = 0;
    int64_t mismatches = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Clock::time_point start = Clock::now();
      eval::Generation g = eval::speculativeDecode(target, *drafter, prompts[i], generation);
      synchronize(device);
      speculativeSeconds += std::chrono::duration<double>(Clock::now() - start).count();
      start = Clock::now();
      const std::vector<int64_t> reference = eval::greedyDecode(target, prompts[i], generation);
      synchronize(device);
      targetSeconds += std::chrono::duration<double>(Clock::now() - start).count();
      if (g.tokens != reference) {
        ++mismatches;
        std::cerr << "dflex-eval: prompt " << i + 1 << ": the speculative output differs from the target's greedy decoding\n";
      }
      std::cerr << "\rprompt " << i + 1 << "/" << prompts.size() << "  tau " << g.acceptanceLength() << std::flush;
      generations.push_back(std::move(g));
    }
    std::cerr << "\n";
    const int64_t blockSize = drafter->config().dflash.blockSize;
    const eval::AcceptanceSummary summary = eval::summarize(generations, blockSize);

    dflex::JsonValue json = dflex::JsonValue::object();
    json["tau"] = summary.tau;
    for (double share : summary.acceptedAtLeast)
      json["accepted_at_least_k"].push(share);
    json["responses"] = summary.responses;
    json["verifications"] = summary.verifications;
    json["tokens"] = summary.tokens;
    json["lossless"] = mismatches == 0;
    json["speculative_seconds"] = speculativeSeconds;
    json["target_only_seconds"] = targetSeconds;
    json["speedup"] = speculativeSeconds > 0 ? targetSeconds / speculativeSeconds : 0.0;
    std::printf("| drafter | tau | tokens | lossless | speed-up over the target alone |\n|---|---|---|---|---|\n");
    std::printf("| %s | %.3f | %lld | %s | %.2fx |\n", drafterDir.c_str(), summary.tau,
                static_cast<long long>(summary.tokens), mismatches ? "NO" : "yes",
                speculativeSeconds > 0 ? targetSeconds / speculativeSeconds : 0.0);
    std::printf("accepted at least k drafts, k = 1 .. %lld:", static_cast<long long>(blockSize - 1));
    for (double share : summary.acceptedAtLeast)
      std::printf(" %.3f", share);
    std::printf("\n");
    if (!outPath.empty()) {
      AtomicFileWriter writer(outPath);
      writer.write(dflex::writeJson(json));
      writer.commit();
    }
    return mismatches ? 1 : 0;
  } catch (const dflex::FormatError &error) {
    std::cerr << "dflex-eval: " << error.what() << "\n";
    return 2;
  } catch (const ChatHelperError &error) { // it named the problem already
    std::cerr << "dflex-eval: " << error.what() << "\n";
    return error.status();
  } catch (const std::exception &error) {
    std::cerr << "dflex-eval: " << error.what() << "\n";
    return 1;
  }
}
