// The rendezvous store of Gloo transports that live in one process (the
// simulated nodes of a test or a benchmark): every link's keys under its
// prefix in one shared base store. Include only from targets that link Gloo.
#ifndef HSDP_TESTS_COMMON_GLOO_STORE_H_
#define HSDP_TESTS_COMMON_GLOO_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"

namespace hsdp::testing {

// A PrefixStore that owns nothing but keeps the shared base store alive (a
// link may outlive the test's or benchmark's own reference).
class SharedPrefixStore : public gloo::rendezvous::PrefixStore {
 public:
  SharedPrefixStore(const std::string& prefix, std::shared_ptr<gloo::rendezvous::Store> base)
      : PrefixStore(prefix, *base), base_(std::move(base)) {}

 private:
  std::shared_ptr<gloo::rendezvous::Store> base_;
};

// A GlooTransportOptions::store: the store of `prefix` inside `base`.
inline std::function<std::unique_ptr<gloo::rendezvous::Store>(const std::string& prefix)>
PrefixedStores(std::shared_ptr<gloo::rendezvous::Store> base) {
  return [base = std::move(base)](const std::string& prefix) {
    return std::unique_ptr<gloo::rendezvous::Store>(new SharedPrefixStore(prefix, base));
  };
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_GLOO_STORE_H_
