#include "TestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"

#include <torch/torch.h>

#include <filesystem>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::test;
namespace fs = std::filesystem;

namespace {

// The same tensors python/safetensors_reference.py builds.
NamedTensors referenceTensors() {
  struct Spec {
    const char *name;
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  const Spec specs[] = {
      {"embed.weight", torch::kBFloat16, {7, 5}},
      {"layers.0.norm", torch::kHalf, {5}},
      {"layers.0.proj", torch::kFloat, {3, 4, 2}},
      {"lengths", torch::kInt, {6}},
      {"offsets", torch::kLong, {4}},
      {"empty", torch::kFloat, {0, 3}},
  };
  NamedTensors tensors;
  for (const Spec &spec : specs) {
    int64_t count = 1;
    for (int64_t extent : spec.shape)
      count *= extent;
    torch::Tensor values;
    if (spec.dtype == torch::kInt || spec.dtype == torch::kLong) {
      int64_t scale = spec.dtype == torch::kLong ? 10'000'000'000 : 7;
      values = torch::arange(count, torch::kLong) * scale - 100;
    } else {
      values = torch::arange(count, torch::kDouble) * 0.25 - 3.0;
    }
    tensors.emplace_back(spec.name, values.to(spec.dtype).reshape(spec.shape));
  }
  return tensors;
}

void expectReference(const SafeTensorsCheckpoint &checkpoint) {
  NamedTensors expected = referenceTensors();
  ASSERT_EQ(checkpoint.names().size(), expected.size());
  for (const auto &[name, tensor] : expected) {
    ASSERT_TRUE(checkpoint.contains(name)) << name;
    torch::Tensor got = checkpoint.tensor(name);
    EXPECT_EQ(got.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), tensor.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, tensor)) << name;
  }
}

// A file with the given header text and data section.
std::string rawFile(const std::string &header, const std::string &data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[i] = char(uint8_t(uint64_t(header.size()) >> (8 * i)));
  return bytes + header + data;
}

} // namespace

TEST(SafeTensors, ReadsFileWrittenByPython) {
  TempDir dir;
  std::string path = dir.file("ref.safetensors");
  CommandResult python = runPythonScript("safetensors_reference.py", "write-single " + path);
  ASSERT_EQ(python.exitCode, 0) << python.output;
  SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(path);
  expectReference(checkpoint);
  EXPECT_EQ(checkpoint.metadata().at("format"), "pt");
}

TEST(SafeTensors, ReadsShardedCheckpointWrittenByPython) {
  TempDir dir;
  CommandResult python =
      runPythonScript("safetensors_reference.py", "write-sharded " + dir.path().string());
  ASSERT_EQ(python.exitCode, 0) << python.output;
  SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(dir.path().string());
  expectReference(checkpoint);
  EXPECT_EQ(checkpoint.metadata().at("total_size"), "1234");
  EXPECT_NE(checkpoint.fileOf("embed.weight").path(), checkpoint.fileOf("offsets").path());
  // The index file itself names the same checkpoint.
  expectReference(SafeTensorsCheckpoint::open(dir.file("model.safetensors.index.json")));
}

TEST(SafeTensors, PythonReadsFileWrittenHere) {
  TempDir dir;
  std::string path = dir.file("out.safetensors");
  saveSafeTensors(path, referenceTensors(), {{"format", "pt"}});
  CommandResult python = runPythonScript("safetensors_reference.py", "check " + path);
  EXPECT_EQ(python.exitCode, 0) << python.output;
  expectReference(SafeTensorsCheckpoint::open(path));
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), {}), 1);
}

TEST(SafeTensors, PythonReadsShardedCheckpointWrittenHere) {
  TempDir dir;
  std::string out = dir.file("ckpt");
  // 64 bytes per shard: the 140-byte float tensor gets a shard of its own.
  std::vector<std::string> files = saveSafeTensorsCheckpoint(out, referenceTensors(), 64);
  ASSERT_GT(files.size(), 2u);
  EXPECT_EQ(fs::path(files.back()).filename(), "model.safetensors.index.json");
  EXPECT_EQ(fs::path(files.front()).filename(),
            "model-00001-of-0000" + std::to_string(files.size() - 1) + ".safetensors");
  CommandResult python = runPythonScript("safetensors_reference.py", "check " + out);
  EXPECT_EQ(python.exitCode, 0) << python.output;
  SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(out);
  expectReference(checkpoint);

  // Saving again as one file replaces the index; the directory stays unambiguous.
  files = saveSafeTensorsCheckpoint(out, referenceTensors(), 1 << 20);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_FALSE(fs::exists(dir.file("ckpt/model.safetensors.index.json")));
  expectReference(SafeTensorsCheckpoint::open(out));
  python = runPythonScript("safetensors_reference.py", "check " + out);
  EXPECT_EQ(python.exitCode, 0) << python.output;
}

TEST(SafeTensors, TensorsAreViewsOfTheMappingThatOutliveTheFile) {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  torch::Tensor original = torch::arange(64, torch::kFloat);
  saveSafeTensors(path, {{"x", original}});
  torch::Tensor view;
  {
    SafeTensorsFile file = SafeTensorsFile::open(path);
    view = file.tensor("x");
    torch::Tensor again = file.tensor("x");
    EXPECT_EQ(view.data_ptr(), again.data_ptr()) << "not a view of the mapping";
  }
  EXPECT_TRUE(torch::equal(view, original));
  // Writes stay private to this process.
  view.fill_(7.0f);
  EXPECT_TRUE(torch::equal(SafeTensorsFile::open(path).tensor("x"), original));
}

TEST(SafeTensors, SavesNonContiguousAndOddDtypes) {
  TempDir dir;
  std::string path = dir.file("b.safetensors");
  torch::Tensor transposed = torch::arange(12, torch::kFloat).reshape({3, 4}).t();
  torch::Tensor flags = torch::tensor({true, false, true});
  torch::Tensor bytes = torch::arange(5, torch::kByte);
  saveSafeTensors(path, {{"t", transposed}, {"flags", flags}, {"bytes", bytes}});
  SafeTensorsFile file = SafeTensorsFile::open(path);
  EXPECT_TRUE(torch::equal(file.tensor("t"), transposed));
  EXPECT_TRUE(torch::equal(file.tensor("flags"), flags));
  EXPECT_TRUE(torch::equal(file.tensor("bytes"), bytes));
}

TEST(SafeTensors, RejectsBadTensorsBeforeWriting) {
  TempDir dir;
  std::string path = dir.file("c.safetensors");
  saveSafeTensors(path, {{"keep", torch::ones({2})}});
  std::string before = readBytes(path);
  expectError<FormatError>(
      [&] {
        saveSafeTensors(path, {{"a", torch::ones({2})}, {"a", torch::ones({3})}});
      },
      {"two tensors named 'a'"});
  expectError<FormatError>(
      [&] { saveSafeTensors(path, {{"z", torch::ones({2}, torch::kComplexFloat)}}); },
      {"cannot store dtype"});
  EXPECT_EQ(readBytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), {}), 1);
}

TEST(SafeTensors, TruncatedFileNamesFileAndTensor) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  saveSafeTensors(path, {{"first", torch::ones({4})}, {"second", torch::ones({4})}});
  std::string bytes = readBytes(path);
  writeBytes(path, bytes.substr(0, bytes.size() - 3));
  expectError<FormatError>([&] { SafeTensorsFile::open(path); },
                           {path, "tensor 'second'", "run past the end", "truncated"});
  writeBytes(path, bytes.substr(0, 20));
  expectError<FormatError>([&] { SafeTensorsFile::open(path); },
                           {path, "header length", "runs past the end of the file"});
  writeBytes(path, bytes.substr(0, 5));
  expectError<FormatError>([&] { SafeTensorsFile::open(path); }, {path, "too short"});
}

TEST(SafeTensors, InconsistentHeadersAreErrors) {
  TempDir dir;
  std::string path = dir.file("h.safetensors");
  auto check = [&](const std::string &header, const std::string &data,
                   std::initializer_list<std::string> fragments) {
    writeBytes(path, rawFile(header, data));
    expectError<FormatError>([&] { SafeTensorsFile::open(path); }, fragments);
  };
  std::string data(16, '\0');
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        data.substr(0, 12), {path, "'b' overlaps tensor 'a'"});
  check(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data.substr(0, 8),
        {path, "tensor 'a'", "shape [3] need 12 bytes", "hold 8"});
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data,
        {path, "8 bytes before tensor 'a'"});
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data,
        {path, "8 bytes after the last tensor"});
  check(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data.substr(0, 8),
        {path, "tensor 'a'", "unsupported dtype 'Q4'"});
  check(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data.substr(0, 8),
        {path, "tensor 'a'", "negative extent"});
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data.substr(0, 8),
        {path, "tensor 'a'", "invalid range"});
  check(R"({"a":{"dtype":"F32","shape":[2]}})", data.substr(0, 8),
        {path, "tensor 'a'", "data_offsets: missing"});
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", data.substr(0, 8),
        {path});
  check(R"({"__metadata__":{"k":1}})", "", {path, "__metadata__", "expected a string"});
}

TEST(SafeTensors, InconsistentIndexIsAnError) {
  TempDir dir;
  CommandResult python =
      runPythonScript("safetensors_reference.py", "write-sharded " + dir.path().string());
  ASSERT_EQ(python.exitCode, 0) << python.output;
  std::string indexPath = dir.file("model.safetensors.index.json");
  std::string index = readBytes(indexPath);
  auto withIndex = [&](const std::string &from, const std::string &to) {
    std::string edited = index;
    size_t at = edited.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    edited.replace(at, from.size(), to);
    writeBytes(indexPath, edited);
  };

  // A shard that is not there.
  withIndex(R"("offsets": "model-00002-of-00002.safetensors")",
            R"("offsets": "model-00003-of-00002.safetensors")");
  expectError<FormatError>([&] { SafeTensorsCheckpoint::open(dir.path().string()); },
                           {indexPath, "tensor 'offsets'", "model-00003-of-00002.safetensors",
                            "does not exist"});
  // A tensor its shard does not hold.
  withIndex(R"("offsets": "model-00002-of-00002.safetensors")",
            R"("offsets": "model-00002-of-00002.safetensors", "ghost": "model-00001-of-00002.safetensors")");
  expectError<FormatError>([&] { SafeTensorsCheckpoint::open(dir.path().string()); },
                           {"tensor 'ghost'", "model-00001-of-00002.safetensors",
                            "has no such tensor"});
  // A shard tensor the index does not list.
  withIndex(R"("lengths": "model-00002-of-00002.safetensors",)", "");
  expectError<FormatError>([&] { SafeTensorsCheckpoint::open(dir.path().string()); },
                           {"holds tensor 'lengths'", "does not list"});
  // A shard name that leaves the directory.
  withIndex(R"("offsets": "model-00002-of-00002.safetensors")",
            R"("offsets": "../model-00002-of-00002.safetensors")");
  expectError<FormatError>([&] { SafeTensorsCheckpoint::open(dir.path().string()); },
                           {"offsets", "not a file name"});

  // Both layouts in one directory.
  writeBytes(indexPath, index);
  saveSafeTensors(dir.file("model.safetensors"), {{"x", torch::ones({1})}});
  expectError<FormatError>([&] { SafeTensorsCheckpoint::open(dir.path().string()); },
                           {"both model.safetensors and model.safetensors.index.json"});
}

TEST(SafeTensors, MissingTensorNamesCheckpoint) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  saveSafeTensors(path, {{"x", torch::ones({1})}});
  SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(path);
  expectError<FormatError>([&] { checkpoint.tensor("y"); }, {path, "no tensor 'y'"});
}
