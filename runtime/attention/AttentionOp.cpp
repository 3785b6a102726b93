#include "dflex/runtime/attention/AttentionOp.h"

#include "AttentionInternal.h"

#include "dflex/Analysis/IntervalEvaluator.h"
#include "dflex/Analysis/TileListCache.h"
#include "dflex/Bundle/Specs.h"
#include "dflex/Codegen/AttentionModule.h"
#include "dflex/Expr/Semantics.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/attention/DeviceUploads.h"
#include "dflex/runtime/support/SavedObject.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

namespace dflex::runtime {

namespace detail {

namespace {

std::string shapeText(const torch::Tensor &t) { return c10::str(t.sizes()); }

/// The torch dtype of a captured tensor's elements (the element types the
/// programs can read).
std::optional<torch::ScalarType> tensorDtype(expr::ScalarType type) {
  switch (type) {
  case expr::ScalarType::I32: return torch::kInt;
  case expr::ScalarType::I64: return torch::kLong;
  case expr::ScalarType::F32: return torch::kFloat;
  case expr::ScalarType::BF16: return torch::kBFloat16;
  default: return std::nullopt;
  }
}

expr::CaptureValue tensorValue(const torch::Tensor &t, expr::ScalarType elementType) {
  expr::CaptureValue value;
  value.data = t.data_ptr();
  value.elementType = elementType;
  value.sizes.assign(t.sizes().begin(), t.sizes().end());
  value.strides.assign(t.strides().begin(), t.strides().end());
  return value;
}

/// A scalar capture's value as the programs hold it: integers sign-extended
/// from their width, floats rounded to their type.
expr::Value scalarValue(const torch::Tensor &t, expr::ScalarType type,
                        const std::string &where) {
  if (t.numel() != 1)
    throw FormatError(where + ": a scalar capture takes a 0-dim (or one-element) tensor, got " +
                      shapeText(t));
  if (expr::isFloat(type)) {
    if (!t.is_floating_point())
      throw FormatError(where + ": expected a floating-point tensor for " +
                        expr::toString(type) + ", got " + std::string(c10::toString(t.scalar_type())));
    torch::Tensor rounded = t.reshape({}).cpu();
    if (type == expr::ScalarType::F16)
      rounded = rounded.to(torch::kHalf);
    else if (type == expr::ScalarType::BF16)
      rounded = rounded.to(torch::kBFloat16);
    return expr::Value::ofFloat(rounded.to(torch::kFloat).item<float>());
  }
  if (t.is_floating_point() || t.is_complex())
    throw FormatError(where + ": expected an integer tensor for " + expr::toString(type) +
                      ", got " + std::string(c10::toString(t.scalar_type())));
  const int64_t v = t.reshape({}).cpu().to(torch::kLong).item<int64_t>();
  const int width = expr::intWidth(type);
  if (width < 64) {
    const int64_t low = -(int64_t(1) << (width - 1));
    const int64_t high = (int64_t(1) << width) - 1; // unsigned reading allowed
    if (v < low || v > high)
      throw FormatError(where + ": " + std::to_string(v) + " does not fit " + expr::toString(type));
  }
  return expr::Value::ofInt(sem::wrap(static_cast<uint64_t>(v), width));
}

} // namespace

AttentionProblem checkInputs(const AttentionKernelSpec &spec, const torch::Tensor &q,
                             const torch::Tensor &k, const torch::Tensor &v) {
  const std::string where = "dflex attention '" + spec.name + "'";
  auto fail = [&](const std::string &problem) { throw FormatError(where + ": " + problem); };
  if (!q.defined() || !k.defined() || !v.defined())
    fail("q, k and v must be tensors");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    fail("q [B, Tq, Hq, D], k and v [B, Tkv, Hkv, D] must have 4 dimensions, got q " +
         shapeText(q) + ", k " + shapeText(k) + ", v " + shapeText(v));
  AttentionProblem p;
  p.batch = q.size(0);
  p.queryLength = q.size(1);
  p.qHeads = q.size(2);
  p.qkHeadDim = q.size(3);
  p.keyLength = k.size(1);
  p.kvHeads = k.size(2);
  p.vHeadDim = v.size(3);
  if (k.size(0) != p.batch || v.size(0) != p.batch || v.size(1) != p.keyLength ||
      v.size(2) != p.kvHeads || k.size(3) != p.qkHeadDim)
    fail("shapes do not agree: q " + shapeText(q) + ", k " + shapeText(k) + ", v " +
         shapeText(v) + " (expected q [B, Tq, Hq, D], k [B, Tkv, Hkv, D], v [B, Tkv, Hkv, Dv])");
  if (p.qHeads != spec.numQHeads || p.kvHeads != spec.numKvHeads)
    fail("the spec has " + std::to_string(spec.numQHeads) + " query and " +
         std::to_string(spec.numKvHeads) + " key/value heads, got " + std::to_string(p.qHeads) +
         " and " + std::to_string(p.kvHeads));
  if (p.qkHeadDim != spec.qkHeadDim || p.vHeadDim != spec.vHeadDim)
    fail("the spec has head dims " + std::to_string(spec.qkHeadDim) + " (q, k) and " +
         std::to_string(spec.vHeadDim) + " (v), got " + std::to_string(p.qkHeadDim) + " and " +
         std::to_string(p.vHeadDim));
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type())
    fail("q, k and v must share a dtype");
  if (k.device() != q.device() || v.device() != q.device())
    fail("q, k and v must be on one device");
  if (!q.is_floating_point())
    fail("q, k and v must be floating-point tensors");
  if (q.is_cuda()) {
    const torch::ScalarType element =
        spec.elementType == "bf16" ? torch::kBFloat16 : torch::kHalf;
    if (q.scalar_type() != element)
      fail("the kernels take " + spec.elementType + " tensors, got " +
           std::string(c10::toString(q.scalar_type())));
    if (p.batch > bundle::kMaxAttentionBatchOrHeads || p.qHeads > bundle::kMaxAttentionBatchOrHeads ||
        p.queryLength > bundle::kMaxAttentionLength || p.keyLength > bundle::kMaxAttentionLength)
      fail("sizes beyond the kernels' limits (batch and heads <= " +
           std::to_string(bundle::kMaxAttentionBatchOrHeads) + ", lengths <= " +
           std::to_string(bundle::kMaxAttentionLength) + ")");
  } else if (!q.is_cpu()) {
    fail("tensors must be on the CPU or a CUDA device, got " + q.device().str());
  }
  return p;
}

std::vector<expr::CaptureValue>
BoundCaptures::forProgram(const expr::Program &program,
                          const codegen::VariantLayout &layout) const {
  std::vector<expr::CaptureValue> values;
  for (const expr::CaptureDecl &decl : program.captures)
    for (size_t i = 0; i < layout.captures.size(); ++i)
      if (layout.captures[i].name == decl.name)
        values.push_back(host.at(i));
  return values;
}

std::vector<uint8_t> BoundCaptures::packDevice(const AttentionKernelSpec &spec) const {
  std::vector<codegen::BoundCapture> bound;
  for (size_t i = 0; i < spec.layout.captures.size(); ++i)
    bound.push_back({spec.layout.captures[i].name, device.at(i)});
  Result<std::vector<uint8_t>> bytes = codegen::packVariant(spec.layout, bound, spec.mask, spec.scoreMod ? &*spec.scoreMod : nullptr);
  if (!bytes.ok())
    throw FormatError("dflex attention '" + spec.name + "': " + bytes.error());
  return std::move(bytes).value();
}

/// A tensor capture that goes to the device from the host: its index among
/// the device values and its contiguous host copy.
struct CaptureUpload {
  size_t value;
  torch::Tensor host;
};

/// Host tensor captures go up in one asynchronous copy, packed 16-byte
/// aligned into one buffer (DeviceUploads: a call repeating another's
/// captures reuses that copy); each device value then points into the
/// device copy. An empty tensor gets one zero element there: the kernels
/// read one element of every tensor capture (sem::readOr).
void uploadCaptures(const std::vector<CaptureUpload> &uploads, const torch::Device &device,
                    BoundCaptures &bound) {
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const CaptureUpload &upload : uploads) {
    offsets.push_back(total);
    const size_t bytes = std::max<size_t>(upload.host.numel(), 1) * upload.host.element_size();
    total += (bytes + 15) / 16 * 16;
  }
  std::vector<uint8_t> packed(total, 0);
  for (size_t i = 0; i < uploads.size(); ++i)
    std::memcpy(packed.data() + offsets[i], uploads[i].host.data_ptr(), uploads[i].host.nbytes());
  const torch::Tensor onDevice = DeviceUploads::instance().get(device, packed);
  for (size_t i = 0; i < uploads.size(); ++i)
    bound.device[uploads[i].value].data = onDevice.data_ptr<uint8_t>() + offsets[i];
  bound.keepAlive.push_back(onDevice);
}

BoundCaptures bindCaptures(const AttentionKernelSpec &spec,
                           const std::vector<torch::Tensor> &captures,
                           const std::optional<torch::Device> &device, bool needHost) {
  const std::vector<std::string> names = spec.captureNames();
  if (captures.size() != names.size()) {
    std::string list;
    for (const std::string &name : names)
      list += (list.empty() ? "" : ", ") + name;
    throw FormatError("dflex attention '" + spec.name + "' takes " +
                      std::to_string(names.size()) + " captures (" +
                      (list.empty() ? "none" : list) + "), got " +
                      std::to_string(captures.size()));
  }
  BoundCaptures bound;
  std::vector<CaptureUpload> uploads;
  for (size_t i = 0; i < captures.size(); ++i) {
    const codegen::CaptureSlot &slot = spec.layout.captures[i];
    const torch::Tensor &t = captures[i];
    const std::string where =
        "dflex attention '" + spec.name + "': capture " + std::to_string(i) + " '" + slot.name + "'";
    if (!t.defined())
      throw FormatError(where + ": missing tensor");
    if (!t.is_cpu() && !t.is_cuda())
      throw FormatError(where + ": must be on the CPU or a CUDA device, got " + t.device().str());
    if (!slot.isTensor) {
      expr::CaptureValue value = expr::CaptureValue::ofScalar(scalarValue(t, slot.elementType, where));
      if (needHost)
        bound.host.push_back(value);
      if (device)
        bound.device.push_back(value);
      continue;
    }
    std::optional<torch::ScalarType> dtype = tensorDtype(slot.elementType);
    if (!dtype)
      throw FormatError(where + ": tensors of " + expr::toString(slot.elementType) +
                        " are not supported");
    if (t.scalar_type() != *dtype || t.dim() != slot.rank)
      throw FormatError(where + ": expected a rank-" + std::to_string(slot.rank) + " " +
                        std::string(c10::toString(*dtype)) + " tensor, got " +
                        std::string(c10::toString(t.scalar_type())) + " " + shapeText(t));
    if (needHost) {
      torch::Tensor hostTensor = t.is_cpu() ? t : t.cpu();
      bound.host.push_back(tensorValue(hostTensor, slot.elementType));
      bound.keepAlive.push_back(hostTensor);
    }
    if (device) {
      if (t.is_cuda() && t.device() != *device)
        throw FormatError(where + ": is on " + t.device().str() + ", the call runs on " +
                          device->str());
      if (t.is_cpu() || t.numel() == 0) {
        const torch::Tensor host = t.cpu().contiguous();
        uploads.push_back({bound.device.size(), host});
        bound.device.push_back(tensorValue(host, slot.elementType)); // data: set on upload
      } else {
        bound.device.push_back(tensorValue(t, slot.elementType));
        bound.keepAlive.push_back(t);
      }
    }
  }
  if (!uploads.empty())
    uploadCaptures(uploads, *device, bound);
  return bound;
}

CallTileLists::CallTileLists(const AttentionKernelSpec &spec, const BoundCaptures &captures,
                             const AttentionProblem &problem, const AttentionKernelPlan &plan)
    : spec_(spec), captures_(captures), problem_(problem), plan_(plan) {}

CallTileLists::~CallTileLists() {
  if (evaluator_)
    spec_.maskEvaluators->give(std::move(evaluator_));
}

std::shared_ptr<const analysis::TileList> CallTileLists::build(analysis::TileListKind pass) {
  auto fail = [&](const std::string &problem) {
    throw FormatError("dflex attention '" + spec_.name + "': " + problem);
  };
  analysis::AttentionShape shape;
  shape.batches = problem_.batch;
  shape.heads = problem_.qHeads;
  shape.queryLength = problem_.queryLength;
  shape.keyLength = problem_.keyLength;
  const AttentionLaunch &launch =
      pass == analysis::TileListKind::Forward ? plan_.forward.launch : plan_.backward.launch;
  const std::vector<expr::CaptureValue> values = captures_.forProgram(spec_.mask, spec_.layout);
  std::optional<analysis::TileListKey> key =
      analysis::TileListKey::of(values, shape, pass, launch.blockM, launch.blockN);
  if (key)
    if (std::shared_ptr<const analysis::TileList> kept = spec_.tileLists->find(*key))
      return kept;
  if (!evaluator_) {
    std::string problem;
    evaluator_ = spec_.maskEvaluators->take();
    if (evaluator_) {
      problem = evaluator_->rebind(values);
    } else {
      analysis::EvaluatorResult created = analysis::IntervalEvaluator::create(spec_.mask, values);
      problem = created.error;
      evaluator_ = std::move(created.evaluator);
    }
    if (!problem.empty())
      fail("mask '" + spec_.mask.name + "': " + problem);
  }
  analysis::TileListResult list =
      analysis::buildTileList(*evaluator_, pass, shape, launch.blockM, launch.blockN);
  if (!list.ok())
    fail(list.error);
  auto built = std::make_shared<const analysis::TileList>(std::move(list.list));
  if (key)
    spec_.tileLists->insert(std::move(*key), built);
  return built;
}

DeviceTileList uploadTileList(const analysis::TileList &list, const torch::Device &device) {
  // Row offsets then entries (at least one, so the pointer is valid), through
  // DeviceUploads: a call whose list repeats another's reuses its copy.
  const size_t offsets = list.rowOffsets.size();
  std::vector<uint8_t> bytes((offsets + std::max<size_t>(list.entries.size(), 1)) * sizeof(int32_t), 0);
  std::memcpy(bytes.data(), list.rowOffsets.data(), offsets * sizeof(int32_t));
  std::memcpy(bytes.data() + offsets * sizeof(int32_t), list.entries.data(),
              list.entries.size() * sizeof(int32_t));
  DeviceTileList tiles;
  tiles.storage = DeviceUploads::instance().get(device, bytes).view(torch::kInt);
  tiles.batches = list.batches;
  tiles.heads = list.heads;
  tiles.rowTiles = list.rowTiles;
  return tiles;
}

namespace {

bool isEmpty(const AttentionProblem &p) {
  return p.batch == 0 || p.queryLength == 0 || p.keyLength == 0;
}

/// The device tile list of one pass of a call (nothing for an empty
/// problem, which the CUDA path answers without kernels).
DeviceTileList callTiles(CallTileLists &lists, const AttentionProblem &problem,
                         analysis::TileListKind pass, const torch::Device &device) {
  if (isEmpty(problem))
    return {};
  // A named range in torch.profiler traces (host time before a launch).
  RECORD_FUNCTION(pass == analysis::TileListKind::Forward ? "dflex::attention_tile_lists (forward)"
                                                          : "dflex::attention_tile_lists (backward)",
                  std::vector<c10::IValue>());
  return uploadTileList(*lists.build(pass), device);
}

AttentionKernelPlan devicePlan(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                               const torch::Device &device, AttentionKernelChoice choice) {
  return planAttentionKernels(bundle, spec, deviceComputeCapability(device.index()), choice);
}

/// `captures` with the scalar captures that are on a device copied to the
/// host (a synchronisation), so that the values are read back once a call.
std::vector<torch::Tensor> scalarCapturesOnHost(const AttentionKernelSpec &spec,
                                                const std::vector<torch::Tensor> &captures) {
  std::vector<torch::Tensor> onHost = captures;
  for (size_t i = 0; i < onHost.size() && i < spec.layout.captures.size(); ++i)
    if (!spec.layout.captures[i].isTensor && onHost[i].defined() && onHost[i].is_cuda())
      onHost[i] = onHost[i].cpu();
  return onHost;
}

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

/// Autograd node of the attention op. The opened bundle and the spec travel
/// to the backward in saved_data; the captures as tensors; on
/// CUDA the backward tile list is built in forward, after the forward kernel
/// is launched, while the captures are on the host anyway.
struct AttentionFunction : public torch::autograd::Function<AttentionFunction> {
  static tensor_list forward(AutogradContext *ctx,
                             const std::shared_ptr<const KernelBundle> &bundle,
                             const AttentionKernelSpec &spec, const torch::Tensor &q,
                             const torch::Tensor &k, const torch::Tensor &v,
                             const std::vector<torch::Tensor> &givenCaptures, bool needBackward) {
    const AttentionProblem problem = checkInputs(spec, q, k, v);
    // Scalar captures read back once: the backward packs them again without
    // a synchronisation of its own.
    const std::vector<torch::Tensor> captures = scalarCapturesOnHost(spec, givenCaptures);
    AttentionOutputs outputs;
    if (q.is_cuda()) {
      const AttentionKernelChoice choice = attentionKernelChoice();
      const AttentionKernelPlan plan = devicePlan(*bundle, spec, q.device(), choice);
      BoundCaptures bound = bindCaptures(spec, captures, q.device(), /*needHost=*/true);
      CallTileLists lists(spec, bound, problem, plan);
      outputs = cudaForward(*bundle, spec, plan, problem, q, k, v, bound,
                            callTiles(lists, problem, analysis::TileListKind::Forward, q.device()));
      ctx->saved_data["kernel_choice"] = static_cast<int64_t>(choice);
      // Built while the forward kernel runs.
      const DeviceTileList tiles =
          needBackward ? callTiles(lists, problem, analysis::TileListKind::Backward, q.device())
                       : DeviceTileList{};
      if (tiles.storage.defined()) {
        ctx->saved_data["backward_tiles"] = tiles.storage;
        ctx->saved_data["backward_tile_shape"] =
            std::vector<int64_t>{tiles.batches, tiles.heads, tiles.rowTiles};
      }
    } else {
      BoundCaptures bound = bindCaptures(spec, captures, std::nullopt, /*needHost=*/true);
      outputs = referenceForward(spec, problem, q, k, v, bound);
    }
    ctx->set_materialize_grads(false); // no zeros for the lse's missing gradient
    ctx->save_for_backward({q, k, v, outputs.out, outputs.logSumExp});
    ctx->saved_data["bundle"] = saveObject(bundle);
    // Owned by the bundle: the aliasing pointer keeps the bundle alive.
    ctx->saved_data["spec"] = saveObject(std::shared_ptr<const AttentionKernelSpec>(bundle, &spec));
    ctx->saved_data["captures"] = captures;
    ctx->mark_non_differentiable({outputs.logSumExp});
    return {outputs.out, outputs.logSumExp};
  }

  static tensor_list backward(AutogradContext *ctx, tensor_list outputGrads) {
    tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const torch::Tensor &out = saved[3], &logSumExp = saved[4];
    const torch::Tensor &gradOut = outputGrads[0];
    if (!gradOut.defined())
      return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
              torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const auto bundle = savedObject<KernelBundle>(ctx->saved_data["bundle"]);
    const AttentionKernelSpec &spec = *savedObject<AttentionKernelSpec>(ctx->saved_data["spec"]);
    const std::vector<torch::Tensor> captures = ctx->saved_data["captures"].toTensorVector();
    const AttentionProblem problem = checkInputs(spec, q, k, v);
    AttentionGrads grads;
    const bool tilesSaved = ctx->saved_data.count("backward_tiles") > 0;
    if (q.is_cuda() && (tilesSaved || isEmpty(problem))) {
      DeviceTileList tiles;
      if (tilesSaved) {
        tiles.storage = ctx->saved_data["backward_tiles"].toTensor();
        const std::vector<int64_t> shape = ctx->saved_data["backward_tile_shape"].toIntVector();
        tiles.batches = shape[0];
        tiles.heads = shape[1];
        tiles.rowTiles = shape[2];
      }
      // The kernels the forward chose: the tile list was built for them.
      const auto choice =
          static_cast<AttentionKernelChoice>(ctx->saved_data["kernel_choice"].toInt());
      BoundCaptures bound = bindCaptures(spec, captures, q.device(), /*needHost=*/false);
      grads = cudaBackward(*bundle, spec, devicePlan(*bundle, spec, q.device(), choice), problem,
                           q, k, v, out, logSumExp, gradOut, bound, tiles);
    } else {
      grads = attentionBackward(*bundle, spec, q, k, v, out, logSumExp, gradOut, captures);
    }
    return {torch::Tensor(), torch::Tensor(), grads.q, grads.k, grads.v, torch::Tensor(),
            torch::Tensor()};
  }
};

} // namespace

} // namespace detail

AttentionOutputs attentionForward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                                  const torch::Tensor &q, const torch::Tensor &k,
                                  const torch::Tensor &v,
                                  const std::vector<torch::Tensor> &captures) {
  using namespace detail;
  const AttentionProblem problem = checkInputs(spec, q, k, v);
  if (!q.is_cuda())
    return referenceForward(spec, problem, q, k, v,
                            bindCaptures(spec, captures, std::nullopt, /*needHost=*/true));
  const AttentionKernelPlan plan = devicePlan(bundle, spec, q.device(), attentionKernelChoice());
  BoundCaptures bound = bindCaptures(spec, captures, q.device(), /*needHost=*/true);
  CallTileLists lists(spec, bound, problem, plan);
  return cudaForward(bundle, spec, plan, problem, q, k, v, bound,
                     callTiles(lists, problem, analysis::TileListKind::Forward, q.device()));
}

AttentionGrads attentionBackward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                                 const torch::Tensor &q, const torch::Tensor &k,
                                 const torch::Tensor &v, const torch::Tensor &out,
                                 const torch::Tensor &logSumExp, const torch::Tensor &gradOut,
                                 const std::vector<torch::Tensor> &captures) {
  using namespace detail;
  const AttentionProblem problem = checkInputs(spec, q, k, v);
  const std::string where = "dflex attention '" + spec.name + "' backward: ";
  const std::vector<int64_t> outShape{problem.batch, problem.queryLength, problem.qHeads,
                                      problem.vHeadDim};
  const std::vector<int64_t> lseShape{problem.batch, problem.qHeads, problem.queryLength};
  if (!out.defined() || !gradOut.defined() || !logSumExp.defined() ||
      out.sizes() != torch::IntArrayRef(outShape) ||
      gradOut.sizes() != torch::IntArrayRef(outShape) ||
      logSumExp.sizes() != torch::IntArrayRef(lseShape))
    throw FormatError(where + "o and grad_o must be [B, Tq, Hq, Dv] " + c10::str(outShape) +
                      " and lse [B, Hq, Tq] " + c10::str(lseShape));
  if (out.device() != q.device() || gradOut.device() != q.device() ||
      logSumExp.device() != q.device())
    throw FormatError(where + "o, lse and grad_o must be on the device of q");
  if (!q.is_cuda())
    return referenceBackward(spec, problem, q, k, v, out, logSumExp, gradOut,
                             bindCaptures(spec, captures, std::nullopt, /*needHost=*/true));
  if (out.scalar_type() != q.scalar_type() || gradOut.scalar_type() != q.scalar_type() ||
      logSumExp.scalar_type() != torch::kFloat)
    throw FormatError(where + "o and grad_o must have the dtype of q, lse must be float32");
  const AttentionKernelPlan plan = devicePlan(bundle, spec, q.device(), attentionKernelChoice());
  BoundCaptures bound = bindCaptures(spec, captures, q.device(), /*needHost=*/true);
  CallTileLists lists(spec, bound, problem, plan);
  return cudaBackward(bundle, spec, plan, problem, q, k, v, out, logSumExp, gradOut, bound,
                      callTiles(lists, problem, analysis::TileListKind::Backward, q.device()));
}

AttentionOutputs attention(const std::shared_ptr<const KernelBundle> &bundle,
                           const AttentionKernelSpec &spec, const torch::Tensor &q,
                           const torch::Tensor &k, const torch::Tensor &v,
                           const std::vector<torch::Tensor> &captures) {
  const bool needBackward = torch::GradMode::is_enabled() &&
                            (q.requires_grad() || k.requires_grad() || v.requires_grad());
  torch::autograd::tensor_list outputs = detail::AttentionFunction::apply(
      bundle, spec, q, k, v, captures, needBackward);
  return {outputs[0], outputs[1]};
}

torch::Tensor attentionMask(const AttentionKernelSpec &spec,
                            const std::vector<torch::Tensor> &captures, int64_t batch,
                            int64_t queryLength, int64_t keyLength) {
  using namespace detail;
  if (batch < 0 || queryLength < 0 || keyLength < 0)
    throw FormatError("dflex attention '" + spec.name + "' mask: negative size");
  BoundCaptures bound = bindCaptures(spec, captures, std::nullopt, /*needHost=*/true);
  const std::vector<expr::CaptureValue> values = bound.forProgram(spec.mask, spec.layout);
  const std::string problem = expr::checkCaptures(spec.mask, values);
  if (!problem.empty())
    throw FormatError("dflex attention '" + spec.name + "': " + problem);
  const int64_t heads = spec.numQHeads;
  torch::Tensor mask = torch::empty({batch, heads, queryLength, keyLength}, torch::kBool);
  bool *data = mask.data_ptr<bool>();
  at::parallel_for(0, batch * heads * queryLength, 1, [&](int64_t begin, int64_t end) {
    std::vector<expr::Value> scratch;
    for (int64_t row = begin; row < end; ++row) {
      const int64_t q = row % queryLength;
      const int64_t h = (row / queryLength) % heads;
      const int64_t b = row / (queryLength * heads);
      for (int64_t kv = 0; kv < keyLength; ++kv)
        data[row * keyLength + kv] = expr::evaluateMask(spec.mask, b, h, q, kv, values, scratch);
    }
  });
  return mask;
}

AttentionKernelChoice attentionKernelChoice() {
  const char *value = std::getenv("DFLEX_ATTENTION_KERNELS");
  const std::string choice = value ? value : "";
  if (choice.empty() || choice == "auto")
    return AttentionKernelChoice::Auto;
  if (choice == "portable")
    return AttentionKernelChoice::Portable;
  if (choice == "sm90")
    return AttentionKernelChoice::Sm90;
  throw FormatError("DFLEX_ATTENTION_KERNELS='" + choice +
                    "': expected auto, portable or sm90");
}

AttentionKernelPlan planAttentionKernels(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                                         int computeCapability, AttentionKernelChoice choice) {
  const std::string plain = "sm_" + std::to_string(computeCapability);
  const std::string specific = plain + "a";
  auto hasCubin = [&](const std::string &arch) {
    auto found = spec.binaries.find(arch);
    return found != spec.binaries.end() && found->second.hasCubins();
  };
  AttentionKernelPlan plan;
  // The arch-specific binary holds the portable kernels too.
  if (hasCubin(specific)) {
    plan.arch = specific;
  } else if (hasCubin(plain)) {
    plan.arch = plain;
  } else {
    plan.compiled = true;
    plan.arch = plain;
    for (const BundleKernel &kernel : spec.kernels)
      if (bundle::kernelRole(kernel.role).requiredTarget == specific)
        plan.arch = specific;
  }
  const bool sm90Forward = spec.hasKernel(bundle::KernelRole::AttentionForwardSm90, plan.arch);
  const bool sm90Backward = spec.hasKernel(bundle::KernelRole::AttentionBackwardSm90, plan.arch);
  if (choice == AttentionKernelChoice::Sm90 && !sm90Forward) {
    const bool listed = spec.hasRole(bundle::KernelRole::AttentionForwardSm90);
    std::string why;
    if (!listed && !codegen::hasSm90Forward(spec.qkHeadDim))
      why = "head_dim " + std::to_string(spec.qkHeadDim) + " has none";
    else if (!listed && spec.binaries.count(specific) > 0)
      why = "its " + specific + " binary was compiled before head_dim " +
            std::to_string(spec.qkHeadDim) + " had them (compile the bundle again)";
    else if (!listed)
      why = "the bundle was compiled without them (dflex-compile --arch sm_90a)";
    else if (computeCapability != 90)
      why = "they run on sm_90 devices (H100/H200), this one is " + plain;
    else
      why = "the bundle's " + plan.arch + " binary does not have them";
    throw FormatError("DFLEX_ATTENTION_KERNELS=sm90: attention spec '" + spec.name +
                      "' has no sm_90a kernels here: " + why);
  }
  // The constants of the binary the kernels come from: each arch's configs
  // (and tiles) are its own.
  const AttentionLaunches launches = bundle.attentionLaunches(spec, plan.arch);
  const bool useSm90 = choice != AttentionKernelChoice::Portable;
  plan.forward = useSm90 && sm90Forward ? AttentionPassKernels{*launches.forwardSm90, true}
                                        : AttentionPassKernels{launches.forward, false};
  plan.backward = useSm90 && sm90Backward ? AttentionPassKernels{*launches.backwardSm90, true}
                                          : AttentionPassKernels{launches.backward, false};
  return plan;
}

analysis::AttentionTileLists attentionTileLists(const AttentionKernelSpec &spec,
                                                const AttentionKernelPlan &plan,
                                                const std::vector<torch::Tensor> &captures,
                                                int64_t batch, int64_t queryLength,
                                                int64_t keyLength) {
  using namespace detail;
  AttentionProblem problem;
  problem.batch = batch;
  problem.queryLength = queryLength;
  problem.keyLength = keyLength;
  problem.qHeads = spec.numQHeads;
  problem.kvHeads = spec.numKvHeads;
  const BoundCaptures bound = bindCaptures(spec, captures, std::nullopt, /*needHost=*/true);
  CallTileLists lists(spec, bound, problem, plan);
  analysis::AttentionTileLists result;
  result.forward = *lists.build(analysis::TileListKind::Forward);
  result.backward = *lists.build(analysis::TileListKind::Backward);
  return result;
}

} // namespace dflex::runtime
