#include "daemon/engine/nccl/nccl_library.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsdp::nccl {
namespace {

constexpr char kSoname[] = "libnccl.so.2";

// The file a handle was loaded from (the loader may have searched for it).
std::string LoadedPath(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

template <typename Fn>
bool Bind(void* handle, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*out == nullptr && missing->empty()) *missing = symbol;
  return *out != nullptr;
}

std::vector<std::string> SearchOrder() {
  if (const char* env = std::getenv("HSDP_NCCL_LIBRARY"); env != nullptr && *env != '\0') {
    return {env};
  }
  std::vector<std::string> order = {kSoname};
#ifdef HSDP_NCCL_BUILD_DIR
  order.push_back(absl::StrCat(HSDP_NCCL_BUILD_DIR, "/", kSoname));
#endif
  for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"}) {
    std::string p = absl::StrCat(dir, "/", kSoname);
    if (std::find(order.begin(), order.end(), p) == order.end()) order.push_back(std::move(p));
  }
  return order;
}

}  // namespace

absl::StatusOr<NcclLibrary> NcclLibrary::Open(const std::string& name) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::NotFoundError(
        absl::StrCat("cannot load ", name, ": ", why != nullptr ? why : "unknown error"));
  }
  NcclLibrary lib;
  lib.path = LoadedPath(handle, name);
  std::string missing;
  Bind(handle, "ncclGetVersion", &lib.GetVersion, &missing);
  Bind(handle, "ncclGetUniqueId", &lib.GetUniqueId, &missing);
  Bind(handle, "ncclGetErrorString", &lib.GetErrorString, &missing);
  Bind(handle, "ncclGetLastError", &lib.GetLastError, &missing);
  Bind(handle, "ncclCommInitRankConfig", &lib.CommInitRankConfig, &missing);
  Bind(handle, "ncclCommFinalize", &lib.CommFinalize, &missing);
  Bind(handle, "ncclCommDestroy", &lib.CommDestroy, &missing);
  Bind(handle, "ncclCommAbort", &lib.CommAbort, &missing);
  Bind(handle, "ncclCommGetAsyncError", &lib.CommGetAsyncError, &missing);
  Bind(handle, "ncclCommUserRank", &lib.CommUserRank, &missing);
  Bind(handle, "ncclGroupStart", &lib.GroupStart, &missing);
  Bind(handle, "ncclGroupEnd", &lib.GroupEnd, &missing);
  Bind(handle, "ncclAllReduce", &lib.AllReduce, &missing);
  Bind(handle, "ncclAllGather", &lib.AllGather, &missing);
  Bind(handle, "ncclReduceScatter", &lib.ReduceScatter, &missing);
  Bind(handle, "ncclBroadcast", &lib.Broadcast, &missing);
  Bind(handle, "ncclSend", &lib.Send, &missing);
  Bind(handle, "ncclRecv", &lib.Recv, &missing);
  Bind(handle, "ncclRedOpCreatePreMulSum", &lib.RedOpCreatePreMulSum, &missing);
  Bind(handle, "ncclRedOpDestroy", &lib.RedOpDestroy, &missing);
  if (!missing.empty()) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        lib.path, " is not a usable NCCL (2.14 or later needed): it has no ", missing));
  }
  Bind(handle, "ncclCommShrink", &lib.CommShrink, &missing);  // optional
  if (lib.GetVersion(&lib.version) != ncclSuccess) lib.version = 0;
  return lib;
}

absl::StatusOr<const NcclLibrary*> NcclLibrary::Default() {
  static const absl::StatusOr<NcclLibrary>* const loaded = [] {
    std::vector<std::string> errors;
    for (const std::string& name : SearchOrder()) {
      absl::StatusOr<NcclLibrary> lib = Open(name);
      if (lib.ok()) return new absl::StatusOr<NcclLibrary>(std::move(lib));
      errors.push_back(std::string(lib.status().message()));
    }
    return new absl::StatusOr<NcclLibrary>(absl::FailedPreconditionError(absl::StrCat(
        "NCCL is not available (set HSDP_NCCL_LIBRARY to its libnccl.so.2): ",
        absl::StrJoin(errors, "; "))));
  }();
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace hsdp::nccl
