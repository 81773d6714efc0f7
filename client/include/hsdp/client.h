// hsdp::Client — the trainer's handle on its node's hsdpd.
//
//   hsdp::ClientOptions opts;
//   opts.job_id = "llama-7b"; opts.rank = r; opts.world_size = n;
//   ASSIGN_OR_RETURN(std::unique_ptr<hsdp::Client> c, hsdp::Client::Connect(opts));
//   ASSIGN_OR_RETURN(hsdp::Buffer buf, c->AllocateBuffer(64 << 20));
//   ASSIGN_OR_RETURN(hsdp::Group world, c->NewGroup({0, 1, ..., n - 1}));
//   ASSIGN_OR_RETURN(hsdp::Work w, c->AllReduce(world, {buf.id, 0}, {buf.id, 0}, count,
//                                               hsdp::DataType::kFloat32, {}));
//   RETURN_IF_ERROR(w.Wait());
//
// Thread-safety: a Client may be used from several threads; submissions are
// serialised internally (they go into one ring in order). Work objects are
// independent values and may be waited on from any thread.
#ifndef HSDP_CLIENT_H_
#define HSDP_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hsdp/types.h"
#include "hsdp/work.h"

namespace hsdp {

struct ClientOptions {
  // Empty: $HSDPD_SOCKET, else the default socket path (see README).
  std::string socket_path;
  // The job's name. A job is its owner's uid plus this name: other users'
  // jobs of the same name are other jobs. Empty: DefaultJobId(world_size).
  std::string job_id;
  // Whose job to join: unset, the caller's own. Only root and the daemon's
  // uid may name another uid, and only for a job that already exists.
  std::optional<uint32_t> owner_uid;
  // The job's class of service (the daemon's jobs.priority_classes). Empty:
  // the class the job matches. A job may only ask for a class at or below
  // its own (PERMISSION_DENIED otherwise); every member gets the class of
  // the job's first member.
  std::string priority_class;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string device = "cpu";
  // Offer device memory at Attach (the daemon agrees only when it runs a
  // device engine). false: a host-only session even on a GPU node.
  bool offer_device_memory = true;
  // How long Connect waits for the daemon to answer.
  absl::Duration connect_timeout = absl::Seconds(10);
  // When the daemon goes away (restarted after `hsdpctl drain`, or killed
  // and restarted by its service manager), the client connects again by
  // itself: the operations in flight fail with UNAVAILABLE (retry them), the
  // next call waits up to `reconnect_timeout` for a daemon on the same
  // socket, attaches again, registers every host buffer again (same memory,
  // same Buffer ids for the caller) and re-creates every group in creation
  // order (same Group values work on). Every member of a group must
  // reconnect for its collectives to match again. Not with device buffers
  // (FAILED_PRECONDITION: connect anew).
  bool reconnect = true;
  absl::Duration reconnect_timeout = absl::Seconds(60);
};

// The job id a client uses when ClientOptions::job_id is empty: one that
// every rank of one launch derives alike and two unrelated launches of the
// same user do not share by accident. The first of
//   $HSDP_JOB_ID                                 as given
//   $TORCHELASTIC_RUN_ID (torchrun; not "none")  "torchelastic-<id>"
//   $SLURM_JOB_ID [+ $SLURM_STEP_ID]             "slurm-<job>[.<step>]"
//   $PMIX_NAMESPACE (Open MPI, PMIx launchers)   "pmix-<namespace>"
// else, for world_size 1 only (no other rank to agree with), a fresh
// "solo-<pid>-<random>". Otherwise INVALID_ARGUMENT asking for a job id.
// Values longer than the daemon's 128-byte limit are refused the same way.
absl::StatusOr<std::string> DefaultJobId(int world_size);

// A host buffer shared with the daemon (a sealed memfd mapped in both
// processes). Owned by the Client: valid until FreeBuffer or the Client dies.
struct Buffer {
  uint64_t id = 0;
  void* data = nullptr;
  size_t size = 0;
};

// A byte offset into a registered buffer.
struct BufferRef {
  uint64_t buffer_id = 0;
  uint64_t offset_bytes = 0;
};

// A communication group: `ranks` are global ranks; this process is `rank`
// (index into ranks) of `size`. Operations run in `epoch`: when a member is
// lost, the group's epoch ends (its operations fail with ABORTED) and the
// survivors call RejoinGroup to get the next one once the lost rank is back.
struct Group {
  uint32_t id = 0;
  int rank = 0;
  int size = 0;
  std::vector<int> ranks;
  uint32_t epoch = 1;
};

// --- device memory (docs/gpu.md) ---
// Handles are opaque bytes / fds: no CUDA type appears here. The
// application (or hsdp.torch.cuda) gets them from the CUDA APIs it uses.
enum class DeviceHandleKind : uint8_t {
  // A cuMem (VMM) allocation exported as a POSIX fd; the client passes a
  // copy over its data connection.
  kVmmFd = 1,
  // cudaIpcGetMemHandle of the allocation base (64 bytes) + the buffer's
  // offset in it (PyTorch's caching allocator).
  kLegacyIpc = 2,
};

struct DeviceBufferSpec {
  DeviceHandleKind kind = DeviceHandleKind::kLegacyIpc;
  int device = 0;                // CUDA ordinal, in the daemon's numbering
  // The GPU's UUID (16 bytes, cuDeviceGetUuid / torch's device uuid). Send
  // it: trainers and hsdpd may number GPUs differently (CUDA_VISIBLE_DEVICES,
  // CUDA_DEVICE_ORDER); when set, the daemon uses it and ignores `device`.
  std::string device_uuid;
  std::string legacy_handle;     // kLegacyIpc: exactly 64 bytes
  int fd = -1;                   // kVmmFd: borrowed; a copy is sent
  uint64_t allocation_bytes = 0; // kVmmFd: size of the exported allocation
  uint64_t offset_bytes = 0;     // of the buffer inside the allocation
  uint64_t size_bytes = 0;       // > 0
  // Bump whenever the allocation's address is handed out again by your
  // allocator: the daemon never reuses a mapping across generations.
  uint64_t generation = 0;
  // kVmmFd: your name for the exported allocation (0: none). Buffers with
  // one id share one daemon mapping; pass the same fd for them.
  uint64_t allocation_id = 0;
  std::string name;              // for status output
};

// Per-submission options of the device path.
struct SubmitOptions {
  // A producer event (RegisterDeviceEvent) recorded on the producing stream
  // before the submission: the daemon's stream waits on it before the
  // collective reads anything. 0: none (the data is ready now).
  uint64_t wait_event_id = 0;
  // Run ahead of this job's other queued operations on the daemon (for
  // all-gathers that gate compute). A hint: a daemon that does not know it
  // (no op-priority feature at Attach) runs the operation in order.
  bool latency_critical = false;
};

class Client {
 public:
  // Attaches a session to the daemon: Attach RPC, data connection, shared
  // channel mapped and checked. UNAVAILABLE when no daemon answers;
  // otherwise the daemon's status and message (INVALID_ARGUMENT for bad
  // options, ALREADY_EXISTS for a rank already attached in the job, ...).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Detaches (if not done yet) and unmaps everything. Outstanding Work
  // objects fail with CANCELLED.
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Allocates `bytes` of zero-filled shared host memory and registers it.
  // RESOURCE_EXHAUSTED (naming the sizes) beyond the daemon's per-session or
  // per-node limit, or when the memory cannot be reserved.
  absl::StatusOr<Buffer> AllocateBuffer(size_t bytes, const std::string& name = "");
  // Unregisters and unmaps. NOT_FOUND for an unknown id.
  absl::Status FreeBuffer(uint64_t buffer_id);
  // The buffer with this id, or NOT_FOUND.
  absl::StatusOr<Buffer> GetBuffer(uint64_t buffer_id) const;

  // Creates (or joins) a group. Every member calls it with the same ranks;
  // the k-th call with a given list names the same group for all members.
  absl::StatusOr<Group> NewGroup(const std::vector<int>& ranks);
  // Joins `group` again after its epoch failed (a member was lost) and
  // returns it with the epoch to use next; operations submitted in that epoch
  // start once every member has joined it (a restarted rank joins by calling
  // NewGroup with the same ranks as before).
  absl::StatusOr<Group> RejoinGroup(const Group& group);

  // Collectives. `count` is in elements of `dtype` (see shm/layout.h); 0 is
  // allowed (the members still match, nothing moves, buffers are not read):
  //   AllReduce / Broadcast: count per rank;  AllGather: count each rank sends;
  //   ReduceScatter: count each rank receives.
  // In place: AllReduce / Broadcast with send == recv; AllGather with send at
  // recv + rank * count elements (FSDP2's layout); ReduceScatter with recv at
  // send + rank * count elements. Any other overlap is INVALID_ARGUMENT.
  // Arguments are checked here (INVALID_ARGUMENT); the daemon checks them
  // again and against the other members. The returned Work completes with
  // the operation's status.
  // `opts`: the device path's producer event (SubmitOptions).
  absl::StatusOr<Work> AllReduce(const Group& g, BufferRef send, BufferRef recv, size_t count,
                                 DataType dtype, const ReduceOptions& reduce = {},
                                 const SubmitOptions& opts = {});
  absl::StatusOr<Work> AllGather(const Group& g, BufferRef send, BufferRef recv, size_t count,
                                 DataType dtype, const SubmitOptions& opts = {});
  absl::StatusOr<Work> ReduceScatter(const Group& g, BufferRef send, BufferRef recv,
                                     size_t count, DataType dtype,
                                     const ReduceOptions& reduce = {},
                                     const SubmitOptions& opts = {});
  absl::StatusOr<Work> Broadcast(const Group& g, BufferRef send, BufferRef recv, size_t count,
                                 DataType dtype, int root, const SubmitOptions& opts = {});
  absl::StatusOr<Work> Barrier(const Group& g);
  // HSDP gradient reduction in one submission: reduce-scatter in `shard`
  // (count = elements each rank receives), then all-reduce of that shard
  // across `replicate`. Divide factors and reduce dtype are applied once; kAvg
  // divides by shard.size * replicate.size.
  absl::StatusOr<Work> ReduceScatterAllReduce(const Group& shard, const Group& replicate,
                                              BufferRef send, BufferRef recv, size_t count,
                                              DataType dtype, const ReduceOptions& reduce = {},
                                              const SubmitOptions& opts = {});

  // Point-to-point, matched per (group, source, destination, tag) in posting
  // order. `dst` / `src` are group ranks other than this one; Recv accepts
  // kAnySource (Work::peer() then names the sender). Sender and receiver must
  // agree on count and dtype (else both fail with INVALID_ARGUMENT).
  absl::StatusOr<Work> Send(const Group& g, BufferRef send, size_t count, DataType dtype, int dst,
                            int tag = 0);
  absl::StatusOr<Work> Recv(const Group& g, BufferRef recv, size_t count, DataType dtype, int src,
                            int tag = 0);
  // All-to-all with equal blocks: rank i's block j (count elements at send +
  // j * count) lands at rank j's recv + i * count. Not in place.
  absl::StatusOr<Work> AllToAll(const Group& g, BufferRef send, BufferRef recv, size_t count,
                                DataType dtype);
  // Uneven blocks: `splits` names 2 * g.size uint64 element counts in a
  // registered buffer — sent to each rank, then received from each — which
  // must stay unchanged until the Work completes. Blocks are packed in rank
  // order in send and recv. Rank i's count for j must equal j's for i.
  absl::StatusOr<Work> AllToAllV(const Group& g, BufferRef send, BufferRef recv,
                                 BufferRef splits, DataType dtype);

  // Device memory. Needs a daemon running a device engine (engine.kind nccl
  // or auto with a GPU): device_memory() says whether the session has it;
  // without it every call below is FAILED_PRECONDITION. Buffer ids returned
  // by RegisterDeviceBuffer are used in BufferRef like host buffer ids (both
  // sides of a collective must be device buffers on one device).
  bool device_memory() const;
  absl::StatusOr<uint64_t> RegisterDeviceBuffer(const DeviceBufferSpec& spec);
  // NOT_FOUND for an unknown id. The daemon unmaps the allocation with its
  // last buffer (an operation still using it keeps it until it completes).
  absl::Status FreeDeviceBuffer(uint64_t buffer_id);
  // An interprocess event (cudaIpcGetEventHandle bytes, 64) for
  // SubmitOptions::wait_event_id.
  // `device_uuid` (16 bytes, optional) names the GPU as in DeviceBufferSpec.
  absl::StatusOr<uint64_t> RegisterDeviceEvent(int device, const std::string& ipc_handle,
                                               const std::string& device_uuid = "");
  absl::Status FreeDeviceEvent(uint64_t event_id);
  // The daemon's completion events on `device`, one interprocess event handle
  // (64 bytes) per ring slot: Work::completion_event_id() k names element
  // k - 1. Call once per device before submitting there: ops submitted
  // before carry no completion event.
  absl::StatusOr<std::vector<std::string>> GetCompletionEvents(int device,
                                                              const std::string& device_uuid = "");

  // Ends the session now (the daemon frees its buffers and groups).
  absl::Status Detach();
  // Connects again now if the daemon went away (see ClientOptions::reconnect;
  // OK and nothing done while the session is fine); the calls that need it
  // do so by themselves. reconnects(): how many times it did.
  absl::Status Reconnect();
  uint64_t reconnects() const;

  uint64_t session_id() const;
  const ClientOptions& options() const;
  const std::string& socket_path() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsdp

#endif  // HSDP_CLIENT_H_
