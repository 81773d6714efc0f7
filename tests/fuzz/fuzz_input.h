// Reading a fuzz input as a script of records, for the targets that play a
// conversation (tests/fuzz/README.md describes each target's format).
//
// A record is [op: u8][len: u16 little-endian][len bytes]; a record cut short
// by the end of the input gets what is left. Plain bytes are easy for
// libFuzzer to mutate and easy for tests/fuzz/make_seeds.py to write.
#ifndef HSDP_TESTS_FUZZ_FUZZ_INPUT_H_
#define HSDP_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace hsdp::fuzz {

struct Record {
  uint8_t op = 0;
  std::string_view payload;
};

class Script {
 public:
  Script(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  // The next record; false at the end of the input.
  bool Next(Record* r) {
    if (p_ >= end_) return false;
    r->op = *p_++;
    size_t len = 0;
    if (end_ - p_ >= 2) {
      len = size_t{p_[0]} | size_t{p_[1]} << 8;
      p_ += 2;
    } else {
      p_ = end_;
    }
    len = std::min(len, static_cast<size_t>(end_ - p_));
    r->payload = std::string_view(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// Fixed-width fields of a payload, zero past its end.
class Fields {
 public:
  explicit Fields(std::string_view s) : s_(s) {}
  template <typename T>
  T Get() {
    T v{};
    const size_t n = std::min(sizeof(T), s_.size() - std::min(pos_, s_.size()));
    if (n > 0) std::memcpy(&v, s_.data() + pos_, n);
    pos_ += sizeof(T);
    return v;
  }
  // The rest of the payload.
  std::string_view Rest() const { return pos_ >= s_.size() ? std::string_view() : s_.substr(pos_); }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

// An oracle failed: the input shows a bug even though nothing crashed.
// Aborts, so libFuzzer saves the input as a crash artifact.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz oracle failed: %s\n", what.c_str());
  std::abort();
}
#define HSDP_FUZZ_CHECK(cond, what)                                               \
  do {                                                                            \
    if (!(cond)) ::hsdp::fuzz::Fail(std::string(#cond ": ") + std::string(what)); \
  } while (0)

}  // namespace hsdp::fuzz

#endif  // HSDP_TESTS_FUZZ_FUZZ_INPUT_H_
