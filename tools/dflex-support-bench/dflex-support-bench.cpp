//===- dflex-support-bench.cpp - Throughput of lib/Support's hashing and JSON ===//
//
// usage: dflex-support-bench [--quick]
//
// Prints, for each case, the best of several runs: SHA-256 of a 256 MiB
// buffer and of many short strings (cache keys hash short fields), CRC-32C
// of a 256 MiB buffer and of short records (token samples), and parsing and
// writing a manifest-like JSON document of about 11 MB. --quick uses 1/16
// of the sizes.
//
//===----------------------------------------------------------------------===//
#include "dflex/Support/Crc32c.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Sha256.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace dflex;

namespace {

// Keeps results alive so that the compiler cannot drop the work.
volatile uint64_t sink;

template <typename F> double bestSeconds(int runs, F &&work) {
  double best = 1e30;
  for (int run = 0; run < runs; ++run) {
    auto start = std::chrono::steady_clock::now();
    work();
    std::chrono::duration<double> elapsed =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  return best;
}

std::string patternBytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i)
    bytes[i] = char((i * 7 + 3) % 251);
  return bytes;
}

// Short strings of 20 to 99 bytes.
std::vector<std::string> shortStrings(size_t count) {
  std::vector<std::string> strings;
  strings.reserve(count);
  for (size_t i = 0; i < count; ++i)
    strings.push_back(patternBytes(20 + i % 80) + std::to_string(i));
  return strings;
}

// A document shaped like a bundle manifest: modules with hashes, names,
// integer resources, launch tables and a few non-integral numbers.
JsonValue manifestLike(int modules) {
  JsonValue manifest = JsonValue::object();
  manifest["format_version"] = 3;
  manifest["source"] = "attention.dflex";
  manifest["source_sha256"] = Sha256::hexDigest("source");
  manifest["archs"].push("sm_90");
  manifest["archs"].push("sm_120");
  for (int m = 0; m < modules; ++m) {
    JsonValue module = JsonValue::object();
    std::string name = "attention_fwd_bwd_variant_" + std::to_string(m);
    module["name"] = name;
    module["kind"] = m % 3 == 0 ? "gated_delta" : "attention";
    module["source_file"] = name + ".cu";
    module["source_sha256"] = Sha256::hexDigest(name);
    JsonValue &variant = module["variant"];
    variant["head_dim"] = 64 << (m % 3);
    variant["block_m"] = 128;
    variant["block_n"] = 64;
    variant["softmax_scale"] = 1.0 / (8.0 + m % 7);
    variant["dropout"] = 0.1 * (m % 4);
    variant["causal"] = m % 2 == 0;
    variant["note"] = "tile \"64x128\", é, 中";
    for (int p = 0; p < 4; ++p) {
      JsonValue program = JsonValue::object();
      program["op"] = "stage_" + std::to_string(p);
      for (int i = 0; i < 8; ++i)
        program["shape"].push(int64_t(1) << (i + p));
      program["weights"].push(0.5 + p);
      program["weights"].push(-1.25e-3 * (m + 1));
      module["programs"].push(std::move(program));
    }
    for (const char *arch : {"sm_90", "sm_120"}) {
      for (const char *role : {"forward", "backward_dq", "backward_dkv"}) {
        JsonValue &kernel = module["kernels"][role]["archs"][arch];
        kernel["lowered_name"] =
            std::string("_ZN5dflex6kernel") + role + std::to_string(m) + "Ev";
        kernel["resources"]["registers"] = 128 + m % 40;
        kernel["resources"]["shared_bytes"] = uint64_t(101376 + 16 * m);
        kernel["resources"]["local_bytes"] = 0;
        kernel["resources"]["max_threads"] = 256;
      }
      JsonValue &binary = module["binaries"][arch];
      binary["ptx"] = name + "." + arch + ".ptx";
      binary["ptx_sha256"] = Sha256::hexDigest(name + arch + "ptx");
      binary["cubin"] = name + "." + arch + ".cubin";
      binary["cubin_sha256"] = Sha256::hexDigest(name + arch + "cubin");
      binary["cache_key"] = Sha256::hexDigest(name + arch + "key");
      for (int s = 0; s < 3; ++s) {
        JsonValue &launch = binary["launch"]["symbol_" + std::to_string(s)];
        launch["grid_x"] = 132 * (s + 1);
        launch["block_x"] = 128;
        launch["dynamic_shared_bytes"] = uint64_t(65536 + 1024 * s);
      }
    }
    manifest["modules"].push(std::move(module));
  }
  return manifest;
}

void report(const char *name, double value, const char *unit) {
  std::printf("%-44s %10.1f %s\n", name, value, unit);
}

} // namespace

int main(int argc, char **argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const size_t scale = quick ? 16 : 1;
  const int runs = 5;

  const std::string big = patternBytes((size_t(256) << 20) / scale);
  const std::vector<std::string> strings = shortStrings(200000 / scale);
  const double mib = double(big.size()) / (1 << 20);

  double seconds = bestSeconds(runs, [&] { sink = Sha256::digest(big)[0]; });
  report("sha256 one buffer (MiB/s)", mib / seconds, "MiB/s");
  seconds = bestSeconds(runs, [&] {
    for (const std::string &s : strings)
      sink = Sha256::digest(s)[0];
  });
  report("sha256 short strings, one-shot (ns/string)",
         seconds / double(strings.size()) * 1e9, "ns");
  seconds = bestSeconds(runs, [&] {
    Sha256 hasher;
    for (const std::string &s : strings)
      hasher.update(s);
    sink = hasher.finish()[0];
  });
  report("sha256 short strings, one stream (ns/update)",
         seconds / double(strings.size()) * 1e9, "ns");

  seconds = bestSeconds(runs, [&] { sink = crc32c(big.data(), big.size()); });
  report("crc32c one buffer (MiB/s)", mib / seconds, "MiB/s");
  seconds = bestSeconds(runs, [&] {
    uint32_t crc = 0;
    for (const std::string &s : strings)
      crc = crc32c(s.data(), s.size(), crc);
    sink = crc;
  });
  report("crc32c short strings, chained (ns/string)",
         seconds / double(strings.size()) * 1e9, "ns");

  const JsonValue manifest = manifestLike(int(2000 / scale));
  const std::string text = writeJson(manifest);
  const double mb = double(text.size()) / 1e6;
  report("json document size (MB)", mb, "MB");
  seconds = bestSeconds(runs, [&] {
    Result<JsonValue> parsed = parseJson(text);
    sink = parsed.ok();
  });
  report("json parse (MB/s)", mb / seconds, "MB/s");
  seconds = bestSeconds(runs, [&] { sink = writeJson(manifest).size(); });
  report("json write, indent 2 (MB/s)", mb / seconds, "MB/s");
  seconds = bestSeconds(runs, [&] { sink = writeJson(manifest, 0).size(); });
  report("json write, indent 0 (MB/s)", mb / seconds, "MB/s");
  return 0;
}
