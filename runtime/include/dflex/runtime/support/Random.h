// A small deterministic generator: the same seed gives the same anchors and
// the same shuffles on every platform and library version (unlike the
// distributions of <random>, whose output the standard leaves open).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace dflex::runtime {

/// SplitMix64 (Steele, Lea and Flood, 2014).
class SplitMix64 {
public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  /// Uniform in [0, bound), bound > 0, without modulo bias (Lemire's
  /// multiply-and-reject).
  uint64_t below(uint64_t bound) {
    __uint128_t product = __uint128_t(next()) * bound;
    uint64_t low = uint64_t(product);
    if (low < bound) {
      uint64_t threshold = -bound % bound;
      while (low < threshold) {
        product = __uint128_t(next()) * bound;
        low = uint64_t(product);
      }
    }
    return uint64_t(product >> 64);
  }

  /// Fisher-Yates.
  template <typename T> void shuffle(std::vector<T> &values) {
    for (size_t i = values.size(); i > 1; --i)
      std::swap(values[i - 1], values[below(i)]);
  }

private:
  uint64_t state_;
};

/// Combines seed parts (e.g. seed, epoch, row) into one well-mixed seed.
inline uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c = 0) {
  SplitMix64 mixer(a ^ SplitMix64(b ^ SplitMix64(c).next()).next());
  return mixer.next();
}

} // namespace dflex::runtime
