// hsdpctl trace --seconds N [-o FILE] [--job J]: arms the daemon's trace
// ring for N seconds, sleeps N seconds, then fetches the last N seconds as
// Chrome trace JSON (open in ui.perfetto.dev or chrome://tracing).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "commands.h"

namespace hsdpctl {

int RunTrace(Context& c) {
  if (!(c.seconds > 0) || c.seconds > 3600) {
    std::cerr << "hsdpctl: trace: --seconds must be in (0, 3600]\n";
    return 2;
  }
  if (c.output.empty()) c.output = "trace.json";
  hsdp::v1::TraceRequest arm;
  arm.set_record_seconds(c.seconds + 1);  // a little longer than the window we ask for
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, c);
    hsdp::v1::TraceResponse r;
    grpc::Status s = c.admin->Trace(&ctx, arm, &r);
    if (!s.ok()) return Fail(c, s);
  }
  std::cerr << "hsdpctl: tracing every operation on the node for " << c.seconds << " s...\n";
  std::this_thread::sleep_for(std::chrono::duration<double>(c.seconds));

  hsdp::v1::TraceRequest fetch;
  fetch.set_window_seconds(c.seconds);
  fetch.set_job_id(c.job);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, c, c.timeout_s + 30);
  hsdp::v1::TraceResponse r;
  grpc::Status s = c.admin->Trace(&ctx, fetch, &r);
  if (!s.ok()) return Fail(c, s);
  if (c.output == "-") {
    std::cout << r.trace_json();
  } else {
    std::ofstream f(c.output, std::ios::binary | std::ios::trunc);
    f << r.trace_json();
    f.close();
    if (!f) {
      std::cerr << "hsdpctl: cannot write " << c.output << "\n";
      return 1;
    }
  }
  hsdp::v1::TraceResponse summary = r;
  summary.clear_trace_json();
  if (c.json) {
    std::cerr << ToJson(summary);
  } else {
    std::cerr << "hsdpctl: wrote " << (c.output == "-" ? "<stdout>" : c.output) << ": " << r.ops()
              << " operations, " << r.member_ops() << " member slices, " << r.events()
              << " events (open in https://ui.perfetto.dev)\n";
  }
  if (r.overwritten() > 0) {
    std::cerr << "hsdpctl: note: the daemon's trace ring (" << r.capacity()
              << " events, trace.buffer_events) has overwritten " << r.overwritten()
              << " events since it started; a busy node may lose the start of the window\n";
  }
  return 0;
}

}  // namespace hsdpctl
