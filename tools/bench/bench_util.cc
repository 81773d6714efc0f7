#include "bench_util.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "hsdp/common/unix_socket.h"

namespace hsdp::bench {
namespace {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // pattern values never underflow
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  uint32_t h = sign | (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t x;
  if (exp == 0) {
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  } else if (exp == 31) {
    x = sign | 0x7f800000 | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace

void StoreAs(DataType t, void* base, uint64_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(base)[i] = float(v); break;
    case DataType::kFloat64: static_cast<double*>(base)[i] = v; break;
    case DataType::kInt32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DataType::kInt64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(base)[i] = uint8_t(v); break;
    case DataType::kFloat16: static_cast<uint16_t*>(base)[i] = FloatToHalf(float(v)); break;
    case DataType::kBFloat16: {
      float f = float(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      x += 0x7fff + ((x >> 16) & 1);
      static_cast<uint16_t*>(base)[i] = uint16_t(x >> 16);
      break;
    }
    default: break;
  }
}

double LoadAs(DataType t, const void* base, uint64_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(base)[i];
    case DataType::kFloat64: return static_cast<const double*>(base)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(base)[i];
    case DataType::kInt64: return double(static_cast<const int64_t*>(base)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(base)[i];
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::kBFloat16: {
      uint32_t x = uint32_t(static_cast<const uint16_t*>(base)[i]) << 16;
      float f;
      std::memcpy(&f, &x, 4);
      return f;
    }
    default: return 0;
  }
}

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  return p.substr(0, p.rfind('/'));
}

pid_t SpawnDaemon(const std::string& bin_dir, std::string* socket, const std::string& extra_args) {
  char tmpl[] = "/tmp/hsdp-bench.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return -1;
  *socket = std::string(tmpl) + "/hsdpd.sock";
  const std::string cmd = bin_dir + "/hsdpd";
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string args = "exec '" + cmd + "' --socket '" + *socket + "' --log-level warning " + extra_args;
    ::execl("/bin/sh", "sh", "-c", args.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    struct stat st;
    if (::stat(socket->c_str(), &st) == 0 && ConnectUnix(*socket).ok()) return pid;
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ::kill(pid, SIGKILL);
  return -1;
}

int StopDaemon(pid_t pid) {
  if (pid <= 0) return -1;
  ::kill(pid, SIGTERM);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace hsdp::bench
