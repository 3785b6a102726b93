#include "TestSupport.h"

#include "dflex/runtime/loss/BlockLoss.h"
#include "dflex/Support/Error.h"

#include <torch/torch.h>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::test;
using torch::Tensor;

namespace {

// The definition: full logits, torch's own autograd.
Tensor denseLoss(const Tensor &hidden, const Tensor &head, const Tensor &labels,
                 const Tensor &weights) {
  Tensor logits = torch::matmul(hidden, head.t());
  Tensor target = logits.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  Tensor w = weights.to(logits.scalar_type());
  return (w * (logits.logsumexp(-1) - target)).sum() / w.sum();
}

struct Problem {
  Tensor hidden, head, labels, weights;
};

// [B, N, K, H] block positions like the trainer's: position 0 of each block and
// a padding block carry no weight (and label -1).
Problem makeProblem(torch::ScalarType dtype, int64_t vocab = 97, int64_t hiddenSize = 32) {
  torch::manual_seed(1);
  Problem p;
  p.hidden = torch::randn({3, 5, 16, hiddenSize}, torch::kDouble).to(dtype);
  p.head = (torch::randn({vocab, hiddenSize}, torch::kDouble) * 0.3).to(dtype);
  p.labels = torch::randint(vocab, {3, 5, 16}, torch::kLong);
  Tensor k = torch::arange(16, torch::kDouble);
  p.weights = torch::exp(-(k - 1) / 7.0).expand({3, 5, 16}).clone().to(torch::kFloat);
  p.weights.select(2, 0).zero_();
  p.weights[1][4].zero_();
  p.weights[2][0].slice(0, 9).zero_(); // a block cut by its document's end
  p.labels.masked_fill_(p.weights == 0, -1);
  return p;
}

} // namespace

TEST(BlockLoss, MatchesDenseReferenceInFloat64) {
  Problem p = makeProblem(torch::kDouble);
  Tensor reference = p.hidden.clone().requires_grad_();
  Tensor dense = denseLoss(reference, p.head, p.labels, p.weights);
  dense.backward();

  for (int64_t chunkRows : {1, 7, 64, 0}) {
    Tensor hidden = p.hidden.clone().requires_grad_();
    BlockLossOptions options;
    options.chunkRows = chunkRows;
    BlockLossResult result = blockCrossEntropy(hidden, p.head, p.labels, p.weights, options);
    result.loss.backward();
    EXPECT_EQ(result.loss.scalar_type(), torch::kDouble);
    EXPECT_NEAR(result.loss.item<double>(), dense.item<double>(), 1e-12) << chunkRows;
    // Float64 end to end: the gradients match to rounding.
    EXPECT_TRUE(torch::allclose(hidden.grad(), reference.grad(), 1e-10, 1e-14))
        << chunkRows << ": max error "
        << (hidden.grad() - reference.grad()).abs().max().item<double>();
    // Positions without weight get no gradient.
    EXPECT_EQ(hidden.grad().select(2, 0).abs().sum().item<double>(), 0.0);
  }
}

TEST(BlockLoss, MatchesDenseReferenceInFloat32AndBFloat16) {
  Problem p = makeProblem(torch::kDouble, 1000, 64);
  Tensor reference = p.hidden.clone().requires_grad_();
  Tensor dense = denseLoss(reference, p.head, p.labels, p.weights);
  dense.backward();
  for (auto [dtype, tolerance] : {std::pair{torch::kFloat, 1e-5}, std::pair{torch::kBFloat16, 3e-2}}) {
    Tensor hidden = p.hidden.to(dtype).requires_grad_();
    BlockLossOptions options;
    options.chunkRows = 13;
    BlockLossResult result =
        blockCrossEntropy(hidden, p.head.to(dtype), p.labels, p.weights, options);
    result.loss.backward();
    EXPECT_EQ(hidden.grad().scalar_type(), dtype);
    EXPECT_NEAR(result.loss.item<double>(), dense.item<double>(),
                tolerance * std::abs(dense.item<double>()));
    double scale = reference.grad().abs().max().item<double>();
    double error = (hidden.grad().to(torch::kDouble) - reference.grad()).abs().max().item<double>();
    EXPECT_LT(error, tolerance * scale) << c10::toString(dtype);
  }
}

// Needs a GPU: CUDA multiplies bf16 operands with a float32 result, a path the
// CPU does not take.
TEST(BlockLoss, CudaMatchesDenseReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "LibTorch sees no CUDA device";
  Problem p = makeProblem(torch::kDouble, 1000, 64);
  Tensor reference = p.hidden.clone().requires_grad_();
  Tensor dense = denseLoss(reference, p.head, p.labels, p.weights);
  dense.backward();
  for (auto [dtype, tolerance] : {std::pair{torch::kFloat, 1e-4}, std::pair{torch::kBFloat16, 3e-2}}) {
    auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
    Tensor hidden = p.hidden.to(cuda.dtype(dtype)).requires_grad_();
    BlockLossOptions options;
    options.chunkRows = 13;
    BlockLossResult result = blockCrossEntropy(hidden, p.head.to(cuda.dtype(dtype)),
                                               p.labels.to(cuda), p.weights.to(cuda), options);
    result.loss.backward();
    EXPECT_TRUE(result.loss.is_cuda());
    EXPECT_NEAR(result.loss.item<double>(), dense.item<double>(),
                tolerance * std::abs(dense.item<double>()));
    double scale = reference.grad().abs().max().item<double>();
    double error =
        (hidden.grad().cpu().to(torch::kDouble) - reference.grad()).abs().max().item<double>();
    EXPECT_LT(error, tolerance * scale) << c10::toString(dtype);
  }
}

TEST(BlockLoss, ReportsCorrectPredictionsAndWeightSum) {
  Problem p = makeProblem(torch::kFloat);
  // Make the label the argmax of some rows.
  Tensor logits = torch::matmul(p.hidden, p.head.t());
  Tensor argmax = logits.argmax(-1);
  Tensor labels = torch::where((torch::arange(16) % 2 == 1).expand({3, 5, 16}), argmax, p.labels);
  labels.masked_fill_(p.weights == 0, -1);
  BlockLossResult result = blockCrossEntropy(p.hidden, p.head, labels, p.weights);
  Tensor expected = (argmax == labels) & (p.weights > 0);
  EXPECT_TRUE(torch::equal(result.correct, expected));
  EXPECT_GT(expected.sum().item<int64_t>(), 50);
  EXPECT_NEAR(result.weightSum.item<double>(), p.weights.sum().item<double>(), 1e-4);
}

TEST(BlockLoss, NormalizerScalesLossAndGradient) {
  Problem p = makeProblem(torch::kDouble);
  Tensor a = p.hidden.clone().requires_grad_(), b = p.hidden.clone().requires_grad_();
  BlockLossResult local = blockCrossEntropy(a, p.head, p.labels, p.weights);
  BlockLossOptions options;
  options.normalizer = 4 * local.weightSum.item<double>();
  BlockLossResult global = blockCrossEntropy(b, p.head, p.labels, p.weights, options);
  local.loss.backward();
  global.loss.backward();
  EXPECT_NEAR(global.loss.item<double>(), local.loss.item<double>() / 4, 1e-6);
  EXPECT_TRUE(torch::allclose(b.grad() * 4, a.grad(), 1e-6, 1e-12));
}

TEST(BlockLoss, NoPositiveWeightGivesZeroLossAndGradient) {
  Problem p = makeProblem(torch::kFloat);
  Tensor hidden = p.hidden.clone().requires_grad_();
  BlockLossResult result =
      blockCrossEntropy(hidden, p.head, torch::full_like(p.labels, -1), torch::zeros_like(p.weights));
  result.loss.backward();
  EXPECT_EQ(result.loss.item<float>(), 0.0f);
  EXPECT_EQ(hidden.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_FALSE(result.correct.any().item<bool>());
}

TEST(BlockLoss, BadInputsAreErrors) {
  Problem p = makeProblem(torch::kFloat);
  Tensor labels = p.labels.clone();
  labels[0][0][3] = 97;
  expectError<FormatError>([&] { blockCrossEntropy(p.hidden, p.head, labels, p.weights); },
                           {"label with positive weight", "[0, 97)"});
  expectError<FormatError>(
      [&] { blockCrossEntropy(p.hidden, p.head.clone().requires_grad_(), p.labels, p.weights); },
      {"frozen"});
  expectError<FormatError>(
      [&] { blockCrossEntropy(p.hidden, p.head.t(), p.labels, p.weights); }, {"hidden size"});
  expectError<FormatError>(
      [&] { blockCrossEntropy(p.hidden, p.head, p.labels.flatten(), p.weights); },
      {"must have the shape of hidden"});
  expectError<FormatError>(
      [&] { blockCrossEntropy(p.hidden, p.head, p.labels, -p.weights - 0.5); }, {"negative"});
}

TEST(BlockLoss, ChunkingBoundsPeakMemory) {
  // Separate processes, so each peak is measured from a clean start.
  auto measure = [](const std::string &mode) {
    std::string command = std::string(DFLEX_LOSS_BENCH) + " --mode " + mode +
                          " --rows 512 --vocab 65536 --hidden 128 --chunk-rows 64 2>&1";
    FILE *pipe = popen(command.c_str(), "r");
    std::string output;
    char buffer[1024];
    while (fgets(buffer, sizeof(buffer), pipe))
      output += buffer;
    EXPECT_EQ(pclose(pipe), 0) << output;
    size_t at = output.find("\"peak_extra_mib\": ");
    EXPECT_NE(at, std::string::npos) << output;
    return at == std::string::npos ? 0.0 : std::stod(output.substr(at + 18));
  };
  double chunked = measure("chunked"), dense = measure("dense");
  RecordProperty("chunked_peak_mib", int(chunked));
  RecordProperty("dense_peak_mib", int(dense));
  // Dense holds several 128 MiB [512 x 65536] float32 buffers; a chunk is 16 MiB.
  EXPECT_GT(dense, 256.0);
  EXPECT_LT(chunked, dense / 4);
}
