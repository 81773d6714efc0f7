// hsdp-gpu-probe: what the driver really does, printed as key=value lines
// for run_gpu_tests.sh --stage probe (docs/gpu.md). Needs a GPU; without one
// it prints `gpu=none reason=...` and exits 3.
//
//   * two cuMem allocations exported as POSIX fds: fstat (st_dev, st_ino,
//     mode), the /proc/self/fd link, and whether kcmp(2) tells the open files
//     apart (the inode names no allocation);
//   * a legacy cudaIpcMemHandle opened twice by a child process: the same
//     pointer? (the driver counts references per handle); both
//     closes succeed and the data reads back;
//   * the device UUIDs;
//   * whether the device supports POSIX-fd handles.
// The child is this program run again with `--child <socket fd>`.
#include <linux/kcmp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/device/cuda_device_api.h"

extern char** environ;

namespace {

using hsdp::device::CudaDeviceApi;
using hsdp::device::IpcHandleBytes;

struct Msg {
  char tag;
  IpcHandleBytes handle;
  uint64_t value;
};

bool SendAll(int fd, const void* p, size_t n) {
  return ::send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}
bool RecvAll(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, static_cast<char*>(p) + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

int Child(int sock) {
  auto api = CudaDeviceApi::Create();
  Msg m{};
  if (!RecvAll(sock, &m, sizeof(m))) return 10;
  auto a = api->ImportLegacy(0, m.handle);
  auto b = api->ImportLegacy(0, m.handle);
  std::printf("legacy_open_1=%s\n", a.ok() ? "ok" : a.status().ToString().c_str());
  std::printf("legacy_open_2=%s\n", b.ok() ? "ok" : b.status().ToString().c_str());
  if (!a.ok() || !b.ok()) return 11;
  std::printf("legacy_reopen_same_pointer=%s\n", a->ptr == b->ptr ? "yes" : "no");
  uint64_t value = 0;
  auto close_a = api->Unmap(*a);
  std::printf("legacy_close_1=%s\n", close_a.ok() ? "ok" : close_a.ToString().c_str());
  auto read = api->CopyToHost(&value, b->ptr, sizeof(value));  // still open through b
  std::printf("legacy_read_after_one_close=%s value_ok=%s\n",
              read.ok() ? "ok" : read.ToString().c_str(), value == m.value ? "yes" : "no");
  auto close_b = api->Unmap(*b);
  std::printf("legacy_close_2=%s\n", close_b.ok() ? "ok" : close_b.ToString().c_str());
  std::fflush(stdout);
  const char done = 'D';
  return SendAll(sock, &done, 1) ? 0 : 12;
}

void ProbeVmm(CudaDeviceApi& api) {
  std::vector<hsdp::UniqueFd> fds;
  for (int i = 0; i < 2; ++i) {
    auto p = api.Allocate(0, 2 << 20, hsdp::device::AllocSharing::kPosixFd);
    if (!p.ok()) {
      std::printf("vmm_alloc_%d=%s\n", i, p.status().ToString().c_str());
      return;
    }
    auto fd = api.ExportFd(*p);
    if (!fd.ok()) {
      std::printf("vmm_export_%d=%s\n", i, fd.status().ToString().c_str());
      return;
    }
    struct stat st{};
    ::fstat(fd->get(), &st);
    char link[256] = {0};
    const std::string path = "/proc/self/fd/" + std::to_string(fd->get());
    const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
    std::printf("vmm_fd_%d dev=%llu ino=%llu mode=0%o link=%s\n", i,
                static_cast<unsigned long long>(st.st_dev),
                static_cast<unsigned long long>(st.st_ino), st.st_mode, n > 0 ? link : "?");
    fds.push_back(*std::move(fd));
  }
  const pid_t self = ::getpid();
  const long k = ::syscall(SYS_kcmp, self, self, KCMP_FILE, fds[0].get(), fds[1].get());
  std::printf("vmm_kcmp=%ld (0: same open file; 1/2: different; -1: refused, errno %d)\n", k,
              k < 0 ? errno : 0);
}

int Parent(const char* self_exe) {
  auto api = CudaDeviceApi::Create();
  if (api->DeviceCount() == 0) {
    std::printf("gpu=none reason=%s\n", api->unavailable_reason().c_str());
    return 3;
  }
  std::printf("devices=%d\n", api->DeviceCount());
  for (int d = 0; d < api->DeviceCount(); ++d) {
    auto u = api->UuidOf(d);
    std::printf("uuid_%d=%s\n", d,
                u.ok() ? hsdp::device::UuidName(*u).c_str() : u.status().ToString().c_str());
  }
  auto scratch = api->Allocate(0, 1 << 20);  // no shareable handle type asked
  std::printf("private_alloc=%s\n", scratch.ok() ? "ok" : scratch.status().ToString().c_str());
  ProbeVmm(*api);

  void* legacy = nullptr;
  const uint64_t magic = 0x600DF00DCAFEull;
  if (cudaMalloc(&legacy, 1 << 20) != cudaSuccess ||
      cudaMemcpy(legacy, &magic, sizeof(magic), cudaMemcpyHostToDevice) != cudaSuccess) {
    std::printf("legacy_alloc=failed\n");
    return 4;
  }
  auto handle = api->ExportLegacy(reinterpret_cast<uint64_t>(legacy));
  if (!handle.ok()) {
    std::printf("legacy_export=%s\n", handle.status().ToString().c_str());
    return 5;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 6;
  std::string exe = self_exe, flag = "--child", fd = std::to_string(sv[1]);
  char* argv[] = {exe.data(), flag.data(), fd.data(), nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, environ) != 0) return 7;
  ::close(sv[1]);
  std::fflush(stdout);
  Msg m{'H', *handle, magic};
  char done = 0;
  const bool ok = SendAll(sv[0], &m, sizeof(m)) && RecvAll(sv[0], &done, 1);
  int st = 0;
  ::waitpid(pid, &st, 0);
  std::printf("legacy_child=%s exit=%d\n", ok ? "ok" : "failed",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  cudaFree(legacy);
  return ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 8;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return Child(std::atoi(argv[2]));
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return 2;
  exe[n] = 0;
  return Parent(exe);
}
