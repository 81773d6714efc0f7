#include "daemon/cluster/gloo_store.h"

#include "absl/time/time.h"
#include "gloo/common/error.h"

namespace hsdp {
namespace {

[[noreturn]] void Throw(const absl::Status& s) {
  throw ::gloo::IoException(std::string(s.ToString()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  const absl::Status s = client_->Set(prefix_ + key, std::string(data.begin(), data.end()),
                                      absl::FromChrono(timeout_));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  wait({key}, timeout_);
  absl::StatusOr<std::string> v = client_->Get(prefix_ + key, absl::FromChrono(timeout_));
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(prefix_ + k);
  const absl::Status s = client_->Wait(full, absl::FromChrono(timeout));
  if (!s.ok()) Throw(s);
}

}  // namespace hsdp
