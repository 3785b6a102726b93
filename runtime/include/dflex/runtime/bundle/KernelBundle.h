// Kernel bundles written by dflex-compile: manifest.json, the generated CUDA
// source, and PTX + cubin per arch (docs/runtime-attention.md).
//
// Opening a bundle parses and checks the whole manifest and verifies every
// file it lists against its sha256, so a damaged or mismatched bundle fails
// at once with an error naming the file. Binaries are read again (and
// re-verified) only when a device needs them.
#pragma once

#include "dflex/Analysis/TileListCache.h"
#include "dflex/Bundle/KernelRoles.h"
#include "dflex/Bundle/Specs.h"
#include "dflex/Codegen/Variant.h"
#include "dflex/Expr/Program.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dflex::analysis {
class IntervalEvaluator;
} // namespace dflex::analysis

namespace dflex::runtime {

/// The launch constants of one pass, read back from a compiled module.
struct AttentionLaunch {
  int64_t threads = 0;          // per block of the main kernel
  int64_t sharedBytes = 0;      // dynamic shared memory of the main kernel
  int64_t blockM = 0;           // query tile
  int64_t blockN = 0;           // key tile
  int64_t rowKernelThreads = 0; // backward only: preprocess and dQ kernels,
  int64_t rowKernelRows = 0;    // and the query rows each of their blocks takes

  bool operator==(const AttentionLaunch &other) const;
  bool operator!=(const AttentionLaunch &other) const { return !(*this == other); }
};

/// The launch constants of a spec's kernels in one arch's binary: each arch
/// is compiled with its own configs (kernels/attention/config.cuh), so its
/// binary has its own constants.
struct AttentionLaunches {
  AttentionLaunch forward, backward; // the portable kernels
  /// The Hopper kernels', in binaries that have them (sm_90a: roles
  /// attention_forward_sm90; attention_backward_preprocess_sm90,
  /// attention_backward_sm90, attention_backward_grad_q_sm90).
  std::optional<AttentionLaunch> forwardSm90, backwardSm90;

  bool operator==(const AttentionLaunches &other) const;
  bool operator!=(const AttentionLaunches &other) const { return !(*this == other); }
};

/// One __global__ function of a module (its required target is its role's,
/// bundle::kernelRole).
struct BundleKernel {
  bundle::KernelRole role;
  std::string nameExpression; // what NVRTC lowers
  std::map<std::string, std::string> loweredNames; // arch -> mangled name, archs that have it
};

/// The files of one part of a binary (bundle::KernelRoleInfo::part). The
/// cubin is absent for compute_XX archs.
struct BundleBinaryPart {
  std::string ptxFile, ptxSha256;
  std::string cubinFile, cubinSha256;
};

/// The binary of one arch: its parts by name.
struct BundleBinary {
  std::string arch;
  std::map<std::string, BundleBinaryPart> parts;
  /// Whether every part has its cubin (the binary loads without NVRTC).
  bool hasCubins() const;
};

/// A dflex.attention spec (its compile-time attributes) and everything
/// needed to run it.
/// Interval evaluators of one spec's mask kept between calls: creating one
/// analyses the mask's program, while rebinding a kept one to a call's
/// captures (IntervalEvaluator::rebind) only summarises them. Thread-safe;
/// an evaluator taken is used by one thread until it is given back.
class MaskEvaluatorPool {
public:
  MaskEvaluatorPool();
  ~MaskEvaluatorPool();
  MaskEvaluatorPool(const MaskEvaluatorPool &) = delete;
  MaskEvaluatorPool &operator=(const MaskEvaluatorPool &) = delete;

  /// A kept evaluator (bound to some earlier call's captures), or null.
  std::unique_ptr<analysis::IntervalEvaluator> take();
  /// Keeps `evaluator` for a later call (a few at most; the rest are freed).
  void give(std::unique_ptr<analysis::IntervalEvaluator> evaluator);

private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<analysis::IntervalEvaluator>> kept_;
};

struct AttentionKernelSpec : bundle::AttentionSpec {
  expr::Program mask;
  std::optional<expr::Program> scoreMod; // carries its derivative
  /// Capture slots of the kernels' variant: the order of the op's capture
  /// list.
  codegen::VariantLayout layout;
  std::vector<BundleKernel> kernels;
  std::map<std::string, BundleBinary> binaries; // arch -> files
  /// arch -> the launch constants of the bundle's binary for it (read from
  /// that binary's PTX by dflex-compile); KernelBundle::attentionLaunches
  /// gives them for any arch.
  std::map<std::string, AttentionLaunches> launches;
  std::string sourceFile, sourceSha256;
  /// The mask's evaluators for tile lists (shared by copies of the spec).
  std::shared_ptr<MaskEvaluatorPool> maskEvaluators = std::make_shared<MaskEvaluatorPool>();
  /// The mask's last tile lists, for calls that repeat its inputs (every
  /// layer of a step; shared by copies of the spec).
  std::shared_ptr<analysis::TileListCache> tileLists = std::make_shared<analysis::TileListCache>();

  const BundleKernel &kernel(bundle::KernelRole role) const;
  /// Whether the spec has a kernel of `role` (in some arch's binary).
  bool hasRole(bundle::KernelRole role) const;
  /// Whether a binary for `arch` (the bundle's, or the source compiled for
  /// it) has the kernel of `role`.
  bool hasKernel(bundle::KernelRole role, const std::string &arch) const;
  std::vector<std::string> captureNames() const;
};

/// The loadable images of a spec's kernels for one arch: one per part of
/// its binary, each loaded as its own CUDA module.
struct KernelImage {
  struct Part {
    std::string image;                   // cubin bytes
    std::string label;                   // where it came from, for errors
    std::vector<bundle::KernelRole> roles; // the kernels it holds
  };
  std::vector<Part> parts;
  std::string arch;                                // the arch it was compiled for
  std::string label;                               // where it came from, for errors
  std::map<bundle::KernelRole, std::string> loweredNames; // role -> mangled name
  bool compiled = false;                           // compiled from source at run time

  /// The index in `parts` of the part holding the kernel of `role`; throws
  /// FormatError when none does.
  size_t partOf(bundle::KernelRole role) const;
};

class KernelBundle : public std::enable_shared_from_this<KernelBundle> {
public:
  /// Parses `directory`/manifest.json and verifies the files it lists.
  /// Throws IoError (a file cannot be read) or FormatError (bad manifest,
  /// sha256 mismatch, unsupported version), naming the file.
  static std::shared_ptr<const KernelBundle> open(const std::string &directory);

  /// open() through a process-wide cache keyed by the directory and the
  /// manifest's inode, size and modification time, so a bundle rewritten or
  /// replaced in place is opened again.
  static std::shared_ptr<const KernelBundle> openCached(const std::string &directory);

  const std::string &directory() const { return directory_; }
  /// The attention spec `name`; throws FormatError listing the specs there.
  const AttentionKernelSpec &attention(const std::string &name) const;
  const std::vector<AttentionKernelSpec> &attentionSpecs() const { return attention_; }

  /// The kernels of `spec` for `arch` ("sm_90a", "sm_120"): the bundle's
  /// cubin for it, else the bundle's source compiled for it by NVRTC through
  /// the kernel cache ($DFLEX_CACHE_DIR, else ~/.cache/dflex), with the
  /// request dflex-compile makes (the kernels `arch` builds), once per
  /// bundle, source and arch. Throws FormatError when that fails, or when
  /// the compile's launch constants differ from the manifest's for `arch`.
  /// planAttentionKernels (Attention.h) picks the arch for a device.
  KernelImage kernelImage(const AttentionKernelSpec &spec, const std::string &arch) const;

  /// The launch constants of `spec`'s kernels in its binary for `arch`: the
  /// manifest's for `arch` where it has them (every binary of the bundle
  /// carries its own), else those read from the PTX of the source compiled
  /// for `arch` (the compile kernelImage loads). Throws FormatError when
  /// that compile fails.
  AttentionLaunches attentionLaunches(const AttentionKernelSpec &spec,
                                      const std::string &arch) const;

  /// Checks that every file of `binary` is there and intact.
  void verifyBinary(const BundleBinary &binary) const;
  /// The image of `binary` (every part with its cubin) and of the kernels
  /// of `kernels` it holds.
  KernelImage binaryImage(const BundleBinary &binary, const std::vector<BundleKernel> &kernels) const;

  /// Contents of a bundle file, checked against `sha256`.
  std::string readVerified(const std::string &file, const std::string &sha256) const;
  std::string path(const std::string &file) const;

private:
  /// A spec's source compiled at run time for one arch.
  struct CompiledAttention {
    KernelImage image;
    AttentionLaunches launches; // read from the compile's PTX
  };
  /// The compile of `spec`'s source for `arch`, done on first use.
  const CompiledAttention &compiledAttention(const AttentionKernelSpec &spec,
                                             const std::string &arch) const;

  std::string directory_;
  std::vector<AttentionKernelSpec> attention_;
  mutable std::mutex compileMutex_;
  /// Run-time compiles by source sha256, arch and requested kernels.
  mutable std::map<std::string, std::unique_ptr<const CompiledAttention>> compiled_;
};

} // namespace dflex::runtime
