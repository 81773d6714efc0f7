// The dispatcher: one thread that drains every session's ring, validates
// each descriptor, and hands it to its group. Idle, it spins briefly, then
// publishes "sleeping" in every session's channel and sleeps on the WakeFd
// that clients write after a push while that flag is set. It also drives
// timeouts and session housekeeping.
#ifndef HSDP_DAEMON_DATAPLANE_DISPATCHER_H_
#define HSDP_DAEMON_DATAPLANE_DISPATCHER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/dataplane/group.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

// What the dispatcher needs from the session manager (a fake in tests).
class SessionDirectory {
 public:
  virtual ~SessionDirectory() = default;
  // Changes whenever the set of sessions changes.
  virtual uint64_t version() const = 0;
  virtual std::vector<std::shared_ptr<Session>> Snapshot() const = 0;
  virtual std::shared_ptr<Group> FindGroup(uint32_t group_id) const = 0;
  virtual std::vector<std::shared_ptr<Group>> AllGroups() const = 0;
  virtual void EndSession(uint64_t session_id, const std::string& why) = 0;
  // Periodic upkeep (expire unclaimed sessions, ...).
  virtual void Housekeeping() = 0;
};

class DeviceBufferRegistry;

// data_plane.spin_mode ("yield" or "pause", as the config validated) as a
// shm::SpinMode.
uint32_t ParseSpinMode(const std::string& name);

class Dispatcher {
 public:
  // `device_buffers`: the device-buffer registry descriptors may name
  // buffers of (kFeatureDeviceMemory); null when no device engine runs.
  // `spin_mode` (shm::SpinMode): how its spin and the clients' share CPUs
  // (published in every session's channel when the dispatcher sees it).
  Dispatcher(SessionDirectory* directory, const WakeFd* wake, int64_t spin_ns,
             const DeviceBufferRegistry* device_buffers = nullptr,
             uint32_t spin_mode = shm::kSpinYield);
  ~Dispatcher();

  void Start();
  // Stops and joins the thread. Idempotent.
  // hsdpctl drain: every operation that arrives from now on is refused
  // (UNAVAILABLE) as an arrival, so its group fails it for every member at
  // once; those already matched run to their end. Thread-safe, one way.
  void BeginDrain() { draining_.store(true); }
  void Stop();

  // Handles one descriptor from `session` (exposed for tests).
  void Handle(const std::shared_ptr<Session>& session, const shm::OpDescriptor& desc);

 private:
  void Loop();
  // Drains every ring once; true when anything was popped.
  bool DrainAll();

  SessionDirectory* const directory_;
  const DeviceBufferRegistry* const device_buffers_;
  // Spins, then sleeps until a ring has work, the session set changed, a
  // stop, or `deadline_ns`.
  void Idle(int64_t deadline_ns);
  bool AnyWork() const;

  const WakeFd* const wake_;
  const int64_t spin_ns_;
  const uint32_t spin_mode_;  // shm::SpinMode
  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  uint64_t seen_version_ = ~uint64_t{0};
  std::vector<std::shared_ptr<Session>> sessions_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_DISPATCHER_H_
