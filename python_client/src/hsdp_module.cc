// hsdp._hsdp — Python bindings of the C++ client library (client/include/hsdp).
//
// Does not link libtorch: torch integration lives in the pure-Python package
// and reaches memory through the buffer protocol and DLPack. Every call that
// can block (connect, RPCs, submission into a full ring, waits) releases the
// GIL. Errors surface as the exceptions of errors.h, never as return codes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "arguments.h"
#include "errors.h"
#include "hsdp/client.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/common/version.h"
#include "hsdp/stragglers.h"
#include "hsdp/types.h"
#include "hsdp/work.h"
#include "py_buffer.h"

namespace hsdp::python {
namespace py = pybind11;
namespace {

// A (buffer id, byte offset) reference: a Buffer (offset 0) or a 2-tuple.
BufferRef ToRef(py::handle h, const char* field) {
  if (py::isinstance<PyBuffer>(h)) {
    PyBuffer& b = h.cast<PyBuffer&>();
    b.CheckUsable();
    return {b.id(), 0};
  }
  try {
    auto t = h.cast<std::pair<uint64_t, uint64_t>>();
    return {t.first, t.second};
  } catch (const py::cast_error&) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a Buffer or a (buffer_id, byte_offset) tuple, got ",
                     std::string(py::str(py::type::of(h))))));
  }
}

// Python-facing Work: wraps the C++ handle; wait() releases the GIL and raises.
class PyWork {
 public:
  explicit PyWork(Work w) : work_(std::move(w)) {}
  bool Test() { return work_.Test(); }
  void Wait(std::optional<double> timeout) {
    const absl::Duration d = SecondsOrInfinite(timeout);
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = work_.Wait(d);
    }
    ThrowIfError(s);
  }
  // None while pending or on success; the exception (not raised) on failure.
  py::object Exception() {
    absl::Status s = work_.status();
    if (s.ok() || !work_.Test()) return py::none();
    try {
      ThrowStatus(s);
    } catch (py::error_already_set& e) {
      return e.value();
    }
  }
  // Work::WaitOnStream: `stream_wait(event_id)` (Python, called with the GIL)
  // enqueues the stream wait before the op reusing the completion event can
  // be submitted. Raises the op's or the callback's error.
  void WaitOnStream(const py::function& stream_wait, std::optional<double> timeout) {
    const absl::Duration d = SecondsOrInfinite(timeout);
    std::optional<py::error_already_set> raised;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = work_.WaitOnStream(
          [&](uint64_t event_id) -> absl::Status {
            py::gil_scoped_acquire acquire;
            try {
              stream_wait(event_id);
            } catch (py::error_already_set& e) {
              raised.emplace(std::move(e));
              return absl::InternalError("the stream-wait callback raised");
            }
            return absl::OkStatus();
          },
          d);
    }
    if (raised) throw std::move(*raised);
    ThrowIfError(s);
  }
  Work& work() { return work_; }

 private:
  Work work_;
};

// Owns the C++ client; Buffers share ownership so their memory stays mapped.
class PyClient {
 public:
  PyClient(const std::string& socket_path, const std::string& job_id, int rank, int world_size,
           int local_rank, const std::string& device, double connect_timeout,
           std::optional<uint32_t> owner_uid, const std::string& priority_class, bool reconnect,
           double reconnect_timeout) {
    ClientOptions o;
    o.reconnect = reconnect;
    o.reconnect_timeout = SecondsOrInfinite(reconnect_timeout);
    o.priority_class = priority_class;
    o.socket_path = socket_path;
    o.job_id = job_id;
    o.owner_uid = owner_uid;
    o.rank = rank;
    o.world_size = world_size;
    o.local_rank = local_rank;
    o.device = device;
    o.connect_timeout = SecondsOrInfinite(connect_timeout);
    absl::StatusOr<std::unique_ptr<Client>> c;
    {
      py::gil_scoped_release release;
      c = Client::Connect(o);
    }
    std::unique_ptr<Client> owned = ValueOrThrow(std::move(c));
    // Destroying a Client detaches (an RPC): never hold the GIL meanwhile.
    client_ = std::shared_ptr<Client>(owned.release(), [](Client* p) {
      if (PyGILState_Check()) {
        py::gil_scoped_release release;
        delete p;
      } else {
        delete p;
      }
    });
  }

  PyBuffer Alloc(size_t nbytes, const std::string& name) {
    absl::StatusOr<Buffer> b;
    {
      py::gil_scoped_release release;
      b = client_->AllocateBuffer(nbytes, name);
    }
    return PyBuffer(client_, ValueOrThrow(std::move(b)), name);
  }

  void Free(py::handle buffer) {
    if (py::isinstance<PyBuffer>(buffer)) {
      buffer.cast<PyBuffer&>().Free();
      return;
    }
    ThrowStatus(absl::InvalidArgumentError(
        "free: expected a Buffer returned by alloc() (ids alone cannot be checked for live "
        "views)"));
  }

  Group NewGroup(const std::vector<int>& ranks) {
    absl::StatusOr<Group> g;
    {
      py::gil_scoped_release release;
      g = client_->NewGroup(ranks);
    }
    return ValueOrThrow(std::move(g));
  }

  Group RejoinGroup(const Group& group) {
    absl::StatusOr<Group> g;
    {
      py::gil_scoped_release release;
      g = client_->RejoinGroup(group);
    }
    return ValueOrThrow(std::move(g));
  }

  // Runs a submission with the GIL released and wraps the Work.
  template <typename F>
  PyWork Submit(F&& submit) {
    absl::StatusOr<Work> w;
    {
      py::gil_scoped_release release;
      w = submit(*client_);
    }
    return PyWork(ValueOrThrow(std::move(w)));
  }

  void Detach() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Detach();
    }
    ThrowIfError(s);
  }

  Client& client() { return *client_; }

 private:
  std::shared_ptr<Client> client_;
};

void BindClient(py::module_& m) {
  py::class_<Group>(m, "Group", "A daemon group: global `ranks`; this process is `rank` of `size`.")
      .def_readonly("id", &Group::id)
      .def_readonly("rank", &Group::rank)
      .def_readonly("size", &Group::size)
      .def_readonly("ranks", &Group::ranks)
      .def_readonly("epoch", &Group::epoch)
      .def("__repr__", [](const Group& g) {
        return absl::StrCat("<hsdp Group id=", g.id, " rank=", g.rank, " size=", g.size, ">");
      });

  py::class_<PyWork>(m, "Work", "The handle of one queued collective.")
      .def("test", &PyWork::Test, "True once the operation ended (ok or not). Never blocks.")
      .def("wait", &PyWork::Wait, py::arg("timeout") = py::none(),
           "Blocks (GIL released) until the operation ends; raises its error, or "
           "DeadlineExceeded after `timeout` seconds (the operation goes on).")
      .def("wait_on_stream", &PyWork::WaitOnStream, py::arg("stream_wait"),
           py::arg("timeout") = py::none(),
           "Device path: waits (GIL released) for the op, then calls stream_wait(event_id) "
           "with its completion event id (when it has one) before the op that reuses that "
           "event can be submitted. stream_wait must only enqueue the stream wait.")
      .def("exception", &PyWork::Exception,
           "The operation's error as an exception object, or None (pending or ok).")
      .def_property_readonly("done", &PyWork::Test)
      .def_property_readonly("op_id", [](PyWork& w) { return w.work().op_id(); })
      .def_property_readonly("queued_ns", [](PyWork& w) { return w.work().queued_ns(); })
      .def_property_readonly("exec_ns", [](PyWork& w) { return w.work().exec_ns(); })
      .def_property_readonly("peer", [](PyWork& w) { return w.work().peer(); },
                             "A finished recv: the group rank the data came from; else -1.")
      .def_property_readonly(
          "completion_event_id", [](PyWork& w) { return w.work().completion_event_id(); },
          "Device path: the daemon's completion event of the finished op (index + 1 into "
          "Client.completion_events(device)); 0 for none.");

  using RO = std::optional<std::string>;
  py::class_<PyClient>(m, "Client", R"doc(
A session with the node's hsdpd. Connects on construction (GIL released);
raises Unavailable when no daemon answers. socket_path "" means $HSDPD_SOCKET,
else the default socket path.)doc")
      .def(py::init<const std::string&, const std::string&, int, int, int, const std::string&,
                    double, std::optional<uint32_t>, const std::string&, bool, double>(),
           py::kw_only(), py::arg("socket_path") = "", py::arg("job_id") = "",
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("local_rank") = 0,
           py::arg("device") = "cpu", py::arg("connect_timeout") = 10.0,
           py::arg("owner_uid") = py::none(), py::arg("priority_class") = "",
           py::arg("reconnect") = true, py::arg("reconnect_timeout") = 60.0)
      .def("alloc", &PyClient::Alloc, py::arg("nbytes"), py::arg("name") = "",
           "Allocates and registers `nbytes` of zero-filled shared memory.")
      .def("free", &PyClient::Free, py::arg("buffer"))
      .def("rejoin_group", &PyClient::RejoinGroup, py::arg("group"),
           "Joins `group` again after its epoch failed; returns it in the next epoch.")
      .def("new_group", &PyClient::NewGroup, py::arg("ranks"),
           "Creates or joins the group of these global ranks (every member passes the same "
           "list; the k-th call with a list names the same group).")
      .def(
          "all_reduce",
          [](PyClient& c, const Group& g, py::handle send, py::handle recv, size_t count,
             const std::string& dtype, const std::string& op, double premul, double pre_divide,
             double post_divide, const RO& reduce_dtype, uint64_t wait_event,
             bool latency_critical) {
            BufferRef s = ToRef(send, "send"), r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            ReduceOptions ro = MakeReduceOptions(op, premul, pre_divide, post_divide, reduce_dtype);
            const SubmitOptions so{wait_event, latency_critical};
            return c.Submit([&](Client& cl) { return cl.AllReduce(g, s, r, count, dt, ro, so); });
          },
          py::arg("group"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::kw_only(), py::arg("op") = "sum", py::arg("premul") = 1.0,
          py::arg("pre_divide") = 1.0, py::arg("post_divide") = 1.0,
          py::arg("reduce_dtype") = py::none(), py::arg("wait_event") = 0,
          py::arg("latency_critical") = false,
          "wait_event: a producer event id (register_device_event) the daemon waits on. "
          "latency_critical: ahead of the job's other queued operations.")
      .def(
          "all_gather",
          [](PyClient& c, const Group& g, py::handle send, py::handle recv, size_t count,
             const std::string& dtype, uint64_t wait_event, bool latency_critical) {
            BufferRef s = ToRef(send, "send"), r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            const SubmitOptions so{wait_event, latency_critical};
            return c.Submit([&](Client& cl) { return cl.AllGather(g, s, r, count, dt, so); });
          },
          py::arg("group"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::kw_only(), py::arg("wait_event") = 0, py::arg("latency_critical") = false,
          "count = elements each rank contributes; latency_critical: ahead of the job's "
          "other queued operations.")
      .def(
          "reduce_scatter",
          [](PyClient& c, const Group& g, py::handle send, py::handle recv, size_t count,
             const std::string& dtype, const std::string& op, double premul, double pre_divide,
             double post_divide, const RO& reduce_dtype, uint64_t wait_event) {
            BufferRef s = ToRef(send, "send"), r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            ReduceOptions ro = MakeReduceOptions(op, premul, pre_divide, post_divide, reduce_dtype);
            const SubmitOptions so{wait_event};
            return c.Submit(
                [&](Client& cl) { return cl.ReduceScatter(g, s, r, count, dt, ro, so); });
          },
          py::arg("group"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::kw_only(), py::arg("op") = "sum", py::arg("premul") = 1.0,
          py::arg("pre_divide") = 1.0, py::arg("post_divide") = 1.0,
          py::arg("reduce_dtype") = py::none(), py::arg("wait_event") = 0,
          "count = elements each rank receives.")
      .def(
          "broadcast",
          [](PyClient& c, const Group& g, py::handle send, py::handle recv, size_t count,
             const std::string& dtype, int root, uint64_t wait_event) {
            BufferRef s = ToRef(send, "send"), r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            const SubmitOptions so{wait_event};
            return c.Submit(
                [&](Client& cl) { return cl.Broadcast(g, s, r, count, dt, root, so); });
          },
          py::arg("group"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("root"), py::kw_only(), py::arg("wait_event") = 0,
          "root = rank within the group.")
      .def(
          "barrier",
          [](PyClient& c, const Group& g) {
            return c.Submit([&](Client& cl) { return cl.Barrier(g); });
          },
          py::arg("group"))
      .def(
          "reduce_scatter_all_reduce",
          [](PyClient& c, const Group& shard, const Group& replicate, py::handle send,
             py::handle recv, size_t count, const std::string& dtype, const std::string& op,
             double premul, double pre_divide, double post_divide, const RO& reduce_dtype,
             uint64_t wait_event) {
            BufferRef s = ToRef(send, "send"), r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            ReduceOptions ro = MakeReduceOptions(op, premul, pre_divide, post_divide, reduce_dtype);
            const SubmitOptions so{wait_event};
            return c.Submit([&](Client& cl) {
              return cl.ReduceScatterAllReduce(shard, replicate, s, r, count, dt, ro, so);
            });
          },
          py::arg("shard"), py::arg("replicate"), py::arg("send"), py::arg("recv"),
          py::arg("count"), py::arg("dtype"), py::kw_only(), py::arg("op") = "sum",
          py::arg("premul") = 1.0, py::arg("pre_divide") = 1.0, py::arg("post_divide") = 1.0,
          py::arg("reduce_dtype") = py::none(), py::arg("wait_event") = 0,
          "HSDP gradient reduction as one submission: reduce-scatter in `shard` (count = "
          "elements each rank receives), then all-reduce of the shard across `replicate`.")
      .def(
          "send",
          [](PyClient& c, const Group& g, py::handle send, size_t count, const std::string& dtype,
             int dst, int tag) {
            BufferRef s = ToRef(send, "send");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            return c.Submit([&](Client& cl) { return cl.Send(g, s, count, dt, dst, tag); });
          },
          py::arg("group"), py::arg("send"), py::arg("count"), py::arg("dtype"), py::arg("dst"),
          py::arg("tag") = 0, "Point-to-point send to group rank `dst` (matched by tag).")
      .def(
          "recv",
          [](PyClient& c, const Group& g, py::handle recv, size_t count, const std::string& dtype,
             int src, int tag) {
            BufferRef r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            return c.Submit([&](Client& cl) { return cl.Recv(g, r, count, dt, src, tag); });
          },
          py::arg("group"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("src"),
          py::arg("tag") = 0,
          "Point-to-point receive from group rank `src` (-1: any; Work.peer names the sender).")
      .def(
          "all_to_all",
          [](PyClient& c, const Group& g, py::handle send, py::handle recv, size_t count,
             const std::string& dtype, py::handle splits) {
            BufferRef s = ToRef(send, "send"), r = ToRef(recv, "recv");
            DataType dt = ParseDtypeOrThrow(dtype, "dtype");
            if (splits.is_none()) {
              return c.Submit([&](Client& cl) { return cl.AllToAll(g, s, r, count, dt); });
            }
            BufferRef sp = ToRef(splits, "splits");
            return c.Submit([&](Client& cl) { return cl.AllToAllV(g, s, r, sp, dt); });
          },
          py::arg("group"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("splits") = py::none(),
          "All-to-all: equal blocks of `count` elements, or uneven blocks whose counts (sent to "
          "each rank, then received from each, as uint64) are at `splits`.")
      // Device memory (docs/gpu.md): handles are bytes / fds, never CUDA types.
      .def_property_readonly("device_memory",
                             [](PyClient& c) { return c.client().device_memory(); },
                             "Whether the session negotiated device memory.")
      .def(
          "register_device_buffer",
          [](PyClient& c, const std::string& kind, int device, const py::bytes& handle, int fd,
             uint64_t allocation_bytes, uint64_t offset, uint64_t size, uint64_t generation,
             const std::string& name, const py::bytes& device_uuid, uint64_t allocation_id) {
            DeviceBufferSpec spec;
            if (kind == "legacy_ipc") {
              spec.kind = DeviceHandleKind::kLegacyIpc;
            } else if (kind == "vmm_fd") {
              spec.kind = DeviceHandleKind::kVmmFd;
            } else {
              ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
                  "kind: unknown device handle kind '", kind, "'; expected legacy_ipc or vmm_fd")));
            }
            spec.device = device;
            spec.legacy_handle = handle;
            spec.fd = fd;
            spec.allocation_bytes = allocation_bytes;
            spec.offset_bytes = offset;
            spec.size_bytes = size;
            spec.generation = generation;
            spec.name = name;
            spec.device_uuid = device_uuid;
            spec.allocation_id = allocation_id;
            absl::StatusOr<uint64_t> id;
            {
              py::gil_scoped_release release;
              id = c.client().RegisterDeviceBuffer(spec);
            }
            return ValueOrThrow(std::move(id));
          },
          py::kw_only(), py::arg("kind"), py::arg("device"), py::arg("handle") = py::bytes(),
          py::arg("fd") = -1, py::arg("allocation_bytes") = 0, py::arg("offset") = 0,
          py::arg("size"), py::arg("generation") = 0, py::arg("name") = "",
          py::arg("device_uuid") = py::bytes(), py::arg("allocation_id") = 0,
          "Registers a range of a device allocation; returns the buffer id (use it as "
          "(id, byte_offset) in collectives). device_uuid (16 bytes): the GPU's UUID, which "
          "wins over `device` (the daemon may number GPUs differently).")
      .def(
          "free_device_buffer",
          [](PyClient& c, uint64_t id) {
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = c.client().FreeDeviceBuffer(id);
            }
            ThrowIfError(s);
          },
          py::arg("buffer_id"))
      .def(
          "register_device_event",
          [](PyClient& c, int device, const py::bytes& handle, const py::bytes& device_uuid) {
            absl::StatusOr<uint64_t> id;
            const std::string h = handle;
            const std::string u = device_uuid;
            {
              py::gil_scoped_release release;
              id = c.client().RegisterDeviceEvent(device, h, u);
            }
            return ValueOrThrow(std::move(id));
          },
          py::arg("device"), py::arg("handle"), py::arg("device_uuid") = py::bytes(),
          "Registers an interprocess event (64 handle bytes) for wait_event=.")
      .def(
          "free_device_event",
          [](PyClient& c, uint64_t id) {
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = c.client().FreeDeviceEvent(id);
            }
            ThrowIfError(s);
          },
          py::arg("event_id"))
      .def(
          "completion_events",
          [](PyClient& c, int device, const py::bytes& device_uuid) {
            absl::StatusOr<std::vector<std::string>> ev;
            const std::string u = device_uuid;
            {
              py::gil_scoped_release release;
              ev = c.client().GetCompletionEvents(device, u);
            }
            py::list out;
            for (const std::string& h : ValueOrThrow(std::move(ev))) out.append(py::bytes(h));
            return out;
          },
          py::arg("device"), py::arg("device_uuid") = py::bytes(),
          "The daemon's completion event handles on `device` (64 bytes each), by slot.")
      .def("detach", &PyClient::Detach,
           "Ends the session now; outstanding Work fails with Cancelled. Buffers stay mapped "
           "until their Python objects are gone.")
      .def_property_readonly("session_id", [](PyClient& c) { return c.client().session_id(); })
      .def_property_readonly("reconnects", [](PyClient& c) { return c.client().reconnects(); },
                             "How many times the client connected again after its daemon went "
                             "away (ClientOptions::reconnect).")
      .def_property_readonly("socket_path", [](PyClient& c) { return c.client().socket_path(); })
      .def_property_readonly("rank", [](PyClient& c) { return c.client().options().rank; })
      .def_property_readonly("world_size",
                             [](PyClient& c) { return c.client().options().world_size; })
      .def_property_readonly("job_id", [](PyClient& c) { return c.client().options().job_id; });
}

}  // namespace

void InitModule(py::module_& m) {
  m.doc() = "Bindings of the hsdpd C++ client library (see hsdp for the Pythonic API).";
  RegisterErrors(m);
  BindBuffer(m);
  BindClient(m);
  m.attr("__version__") = kHsdpVersion;
  m.def("default_socket_path", &ClientDefaultSocketPath,
        "The socket a client uses with no explicit path: $HSDPD_SOCKET, else the first "
        "existing default socket, else the daemon's default path.");
  m.def("default_pre_divide_factor", &DefaultPreDivideFactor, py::arg("world_size"),
        "The power-of-two pre-divide factor for a reduction over `world_size` ranks.");
  m.def(
      "dtype_size",
      [](const std::string& name) { return DataTypeSize(ParseDtypeOrThrow(name, "dtype")); },
      py::arg("dtype"), "Bytes per element of an hsdp dtype name.");
  m.def(
      "canonical_dtype",
      [](const std::string& name) {
        return std::string(DataTypeName(ParseDtypeOrThrow(name, "dtype")));
      },
      py::arg("dtype"));
  m.def(
      "stragglers",
      [](const std::string& socket_path, const std::string& job_id, double timeout) {
        absl::StatusOr<StragglerReport> r;
        {
          py::gil_scoped_release nogil;
          r = QueryStragglers(socket_path, job_id, SecondsOrInfinite(timeout));
        }
        if (!r.ok()) ThrowStatus(r.status());
        py::list ranks;
        for (const StragglerRank& s : r->ranks) {
          py::list recent;
          for (const StragglerOp& o : s.recent) {
            py::dict e;
            e["event_id"] = o.event_id;
            e["group_id"] = o.group_id;
            e["op"] = o.op;
            e["seq"] = o.seq;
            e["epoch"] = o.epoch;
            e["waited_seconds"] = o.waited_seconds;
            e["age_seconds"] = o.age_seconds;
            recent.append(e);
          }
          py::dict d;
          d["job_id"] = s.job_id;
          d["owner_uid"] = s.owner_uid;
          d["rank"] = s.rank;
          d["times_last"] = s.times_last;
          d["waited_seconds_total"] = s.waited_seconds_total;
          d["p50_seconds"] = s.p50_seconds;
          d["p90_seconds"] = s.p90_seconds;
          d["p99_seconds"] = s.p99_seconds;
          d["max_seconds"] = s.max_seconds;
          d["recent"] = recent;
          ranks.append(d);
        }
        py::dict out;
        out["ranks"] = ranks;
        out["ops_matched"] = r->ops_matched;
        return out;
      },
      py::arg("socket_path") = "", py::arg("job_id") = "", py::arg("timeout") = 10.0,
      "hsdpd's straggler report (Admin RPC Stragglers) as {'ranks': [...], 'ops_matched': "
      "{job: n}}; see hsdp.stragglers.");
}

}  // namespace hsdp::python

PYBIND11_MODULE(_hsdp, m) { hsdp::python::InitModule(m); }
