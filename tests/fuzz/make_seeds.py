#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Each seed is a small, valid conversation (or a near miss) that starts the
fuzzer where the interesting code is; the formats are described at the top of
each <target>.cc. Run from anywhere:

    python3 tests/fuzz/make_seeds.py        # rewrites tests/fuzz/corpus/

Protobuf requests are written with `protoc --encode` from text format, so the
seeds stay readable here. The output is deterministic; commit it.
"""
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")

# hsdp/types.h
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BARRIER, RS_AR, SEND, RECV, ALL_TO_ALL = range(1, 10)
F32, F16, BF16, F64, I32, I64, U8 = range(1, 8)
SUM, AVG, PREMUL, MIN, MAX, PROD = range(1, 7)
FEATURES = 0b101  # epochs | point-to-point (hsdp/shm/layout.h)


def desc(op_id=1, seq=1, seq2=0, count=16, send=(1, 0), recv=(1, 0), premul=1.0, pre=1.0,
         post=1.0, group=1, group2=0, root=0, coll=ALL_REDUCE, dtype=F32, rop=SUM, rdt=0,
         flags=0, epoch=1, epoch2=0, peer=0, tag=0, event=0, splits=(0, 0)):
    """An OpDescriptor (hsdp/shm/layout.h), 192 bytes."""
    return struct.pack("<QQQQQQQQdddIIiBBBBIIIiiIQQQ5Q", op_id, seq, seq2, count, send[0], send[1],
                       recv[0], recv[1], premul, pre, post, group, group2, root, coll, dtype, rop,
                       rdt, flags, epoch, epoch2, peer, tag, 0, event, splits[0], splits[1],
                       0, 0, 0, 0, 0)


def rec(op, payload=b""):
    """A record of fuzz_input.h."""
    return struct.pack("<BH", op, len(payload)) + payload


def encode(message, text, proto):
    return subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
                           "--encode=" + message, os.path.join(ROOT, "proto", proto)],
                          input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def descriptor_seeds():
    t = "descriptor_fuzz"
    head = bytes([FEATURES, 0, 1])  # features, group_rank 0, group_size 2
    write(t, "all_reduce", head + desc(count=16, send=(1, 0), recv=(1, 1024)))
    write(t, "all_reduce_inplace", head + desc(count=16))
    write(t, "all_gather_inplace", head + desc(coll=ALL_GATHER, count=8, send=(1, 0), recv=(1, 0)))
    write(t, "reduce_scatter", head + desc(coll=REDUCE_SCATTER, count=8, send=(3, 0), recv=(2, 0)))
    write(t, "broadcast", head + desc(coll=BROADCAST, root=1, send=(2, 0), recv=(2, 0)))
    write(t, "barrier", head + desc(coll=BARRIER, count=0))
    write(t, "composite", head + desc(coll=RS_AR, group2=2, seq2=1, epoch2=1, send=(3, 0),
                                      recv=(2, 0), rop=AVG, pre=2.0, post=2.0, rdt=F32))
    write(t, "send", head + desc(coll=SEND, seq=0, peer=1, tag=7, rop=0))
    write(t, "recv_any", head + desc(coll=RECV, seq=0, peer=-1, rop=0, recv=(2, 0)))
    write(t, "all_to_all", head + desc(coll=ALL_TO_ALL, count=4, send=(1, 0), recv=(1, 2048)))
    write(t, "all_to_all_splits", head + desc(coll=ALL_TO_ALL, count=0, send=(1, 0),
                                              recv=(1, 2048), splits=(3, 0))
          + struct.pack("<4Q", 3, 5, 2, 6))
    write(t, "bf16_premul", head + desc(dtype=BF16, rop=PREMUL, premul=-0.5, count=32))
    write(t, "count_max", head + desc(count=1 << 40))
    write(t, "int_max", head + desc(dtype=I64, rop=MAX, count=8))
    write(t, "wait_event_device", bytes([FEATURES | 2, 0, 1]) + desc(flags=1, event=3,
                                                                      send=(1 << 62 | 1, 0)))


def dispatcher_seeds():
    t = "dispatcher_fuzz"
    # Ranks 0..2; groups 1 = {0,1,2}, 2 = {0,1}, 3 = {1,2}; buffers 1 (4096 B), 2 (256 B).
    def push(s, **kw):
        return rec(0, bytes([s]) + desc(**kw))
    ok = b"".join(push(s, op_id=1, count=16, send=(1, 0), recv=(1, 1024)) for s in range(3))
    write(t, "all_reduce_executed", ok + rec(2, b"\x02"))
    write(t, "all_reduce_completed", ok + rec(2, b"\x00"))
    write(t, "all_reduce_failed", ok + rec(2, b"\x01"))
    write(t, "all_reduce_aborted", ok + rec(2, b"\x03"))
    write(t, "two_members_then_timeout",
          push(0, group=2, count=4) + push(1, group=2, count=4, recv=(2, 0), send=(2, 0))
          + push(0, op_id=2, seq=2, group=2) + rec(4, b"\x05") + rec(2, b"\x02"))
    write(t, "disagreement", push(0, group=2, count=4) + push(1, group=2, count=8) + rec(2, b"\x02"))
    write(t, "member_dies", push(0, group=1) + push(1, group=1) + rec(3, b"\x02") + rec(5)
          + rec(6, b"\x02\x01") + push(2, op_id=1, seq=1, epoch=2))
    write(t, "all_gather", b"".join(push(s, coll=ALL_GATHER, count=8, send=(2, 0), recv=(1, 0))
                                    for s in range(3)) + rec(2, b"\x02"))
    write(t, "reduce_scatter", b"".join(push(s, coll=REDUCE_SCATTER, count=8, send=(1, 0), recv=(2, 0))
                                        for s in range(3)) + rec(2, b"\x02"))
    write(t, "composite", push(0, coll=RS_AR, group=2, group2=1, seq2=1, epoch2=1, count=4,
                               send=(1, 0), recv=(2, 0))
          + push(1, coll=RS_AR, group=2, group2=1, seq2=1, epoch2=1, count=4, send=(1, 0), recv=(2, 0))
          + push(2, coll=ALL_REDUCE, group=1, count=4, send=(2, 0), recv=(2, 0))
          + rec(2, b"\x02") + rec(2, b"\x02"))
    write(t, "send_recv", push(0, coll=SEND, seq=0, group=2, peer=1, rop=0, count=8)
          + push(1, coll=RECV, seq=0, group=2, peer=0, rop=0, count=8, recv=(2, 0)) + rec(2, b"\x02"))
    write(t, "all_to_all_splits",
          b"".join(push(s, coll=ALL_TO_ALL, group=2, count=0, send=(1, 0), recv=(1, 2048),
                        splits=(2, 0), rop=0) for s in range(2)) + rec(2, b"\x02"))
    write(t, "corrupt_head", push(0) + rec(1, b"\x00" + struct.pack("<Q", 1 << 40)))
    write(t, "broadcast", b"".join(push(s, coll=BROADCAST, root=2, group=1, count=8) for s in range(3))
          + rec(2, b"\x02"))


def data_conn_seeds():
    t = "data_conn_fuzz"
    fdmsg = lambda kind, tag, what: rec(2, struct.pack("<IQB", kind, tag, what))
    write(t, "hello", rec(1))
    write(t, "hello_memfd", rec(1) + fdmsg(0, 1, 0))
    write(t, "hello_two_memfds", rec(1) + fdmsg(0, 1, 0) + fdmsg(0, 2, 0))
    write(t, "hello_unsealed", rec(1) + fdmsg(0, 1, 1))
    write(t, "hello_pipe", rec(1) + fdmsg(0, 1, 2))
    write(t, "hello_socket", rec(1) + fdmsg(0, 1, 3))
    write(t, "hello_file", rec(1) + fdmsg(0, 1, 4))
    write(t, "hello_devnull", rec(1) + fdmsg(0, 1, 5))
    write(t, "hello_dir", rec(1) + fdmsg(0, 1, 6))
    write(t, "hello_device_handle", rec(1) + fdmsg(1, 1, 0))
    write(t, "hello_unknown_kind", rec(1) + fdmsg(7, 1, 0))
    write(t, "hello_no_fd", rec(1) + fdmsg(0, 1, 8))
    write(t, "hello_tag_zero", rec(1) + fdmsg(0, 0, 0))
    write(t, "hello_three_fds", rec(1) + rec(3, b"\x03" + struct.pack("<IIQ", 0x31444648, 0, 1)))
    write(t, "hello_with_fd", rec(3, b"\x01" + b"HSDPDAT1"))
    write(t, "bad_token", rec(1, bytes(24) + b"\x01"))
    write(t, "bad_session", rec(1, bytes(16) + b"\x07"))
    write(t, "bad_version", rec(1, bytes(8) + b"\x01"))
    write(t, "denied_uid", rec(4) + rec(1))
    write(t, "hello_split", rec(0, b"HSDPD") + rec(0, b"AT1"))
    write(t, "grpc_preface", rec(0, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
    write(t, "short", rec(0, b"HSD"))
    write(t, "hello_twice", rec(1) + rec(1))


def node_config_seeds():
    t = "node_config_fuzz"
    with open(os.path.join(ROOT, "deploy", "node.yaml"), "rb") as f:
        write(t, "deploy_node_yaml", f.read())
    write(t, "empty", b"")
    write(t, "engine", b"engine:\n  kind: cpu\n  threads: 2\n  inline_max_bytes: 64KiB\n")
    write(t, "limits", b"limits:\n  max_sessions: 16\n  max_session_bytes: 1GiB\n"
                       b"  max_connections_per_uid: 8\n  max_node_bytes: 0\n")
    write(t, "node", b"node:\n  name: n0\n  socket: /run/hsdpd/hsdpd.sock\n  socket_mode: 0660\n"
                     b"  allowed_uids: [0, 1000]\n")
    write(t, "cluster", b"cluster:\n  coordinator: \"10.0.0.1:7070\"\n  listen: \"10.0.0.2:7070\"\n"
                        b"  nodes: 3\n  node_rank: 1\n  token_file: /etc/hsdpd/token\n"
                        b"  heartbeat_ms: 500\n  missed_heartbeats: 4\n")
    write(t, "cluster_tls", b"cluster:\n  coordinator: \"[::1]:7070\"\n  listen: \"[::1]:7071\"\n"
                            b"  tls:\n    ca: /etc/ca.pem\n    cert: /etc/c.pem\n    key: /etc/k.pem\n")
    write(t, "timeouts", b"timeouts:\n  collective_ms: 1000\n  data_connect_ms: 100\n"
                         b"  shutdown_grace_ms: 0\n  hello_ms: 50\n  idle_connection_ms: 100\n")
    write(t, "misc", b"data_plane:\n  ring_entries: 64\n  spin_us: 0\nlog:\n  level: warn\n"
                     b"metrics:\n  listen: \"127.0.0.1:0\"\ntrace:\n  buffer_events: 1024\n")
    write(t, "typo", b"enigne:\n  threads: 2\n")
    write(t, "two_documents", b"engine: {}\n---\nlimits: {}\n")
    write(t, "anchors", b"a: &x {threads: 1}\nengine: *x\n")
    write(t, "flow", b"{engine: {kind: auto, device: fake}, limits: {max_sessions: 65536}}\n")


def cluster_seeds():
    t = "cluster_service_fuzz"
    P = "hsdp/v1/cluster.proto"
    def call(op, message, text):
        return rec(op, encode("hsdp.v1." + message, text, P))
    join = lambda addr, inst, rank=-1, extra="": call(
        0, "JoinRequest", f'address: "{addr}" data_address: "h" name: "n" requested_rank: {rank} '
                          f'nodes: 3 instance: "{inst}" {extra}')
    hb = lambda rank, inst, after=0: call(1, "HeartbeatRequest",
                                          f'node_rank: {rank} instance: "{inst}" events_after: {after}')
    report = lambda rank, inst, key, epoch: call(
        2, "ReportRequest", f'node_rank: {rank} instance: "{inst}" events {{ group_key: "{key}" '
                            f'epoch: {epoch} why: "rank 3 died" }}')
    write(t, "join_heartbeat", join("10.0.0.1:7070", "a", 0) + join("10.0.0.2:7070", "b")
          + hb(1, "b"))
    write(t, "report_relay", join("10.0.0.1:7070", "a") + join("10.0.0.2:7070", "b")
          + report(1, "b", "0/3:job/0,1/0", 1) + hb(0, "a") + hb(0, "a", 1))
    write(t, "lost_and_back", join("10.0.0.2:7070", "b") + rec(9, b"\x0a") + hb(1, "b")
          + join("10.0.0.2:7070", "c", extra="last_epoch: 7") + hb(1, "c"))
    write(t, "full_cluster", join("10.0.0.2:7070", "b") + join("10.0.0.3:7070", "c")
          + join("10.0.0.4:7070", "d") + join("10.0.0.1:7070", "a"))
    write(t, "rank_conflict", join("10.0.0.2:7070", "b", 2) + join("10.0.0.3:7070", "c", 2))
    write(t, "kv", call(3, "KvSetRequest", 'key: "hsdp/x" value: "1"')
          + call(3, "KvSetRequest", 'key: "hsdp/x" value: "2" if_absent: true')
          + call(4, "KvGetRequest", 'key: "hsdp/x"') + call(6, "KvAddRequest", 'key: "c" delta: 5')
          + call(6, "KvAddRequest", 'key: "hsdp/x" delta: -9223372036854775807')
          + call(8, "KvDeleteRequest", 'keys: "hsdp/x" keys: "c"'))
    write(t, "wait", call(5, "KvWaitRequest", 'keys: "a" keys: "b" timeout_ms: 60000 return_values: true')
          + call(3, "KvSetRequest", 'key: "a" value: "1"') + call(3, "KvSetRequest", 'key: "b" value: "2"')
          + call(5, "KvWaitRequest", 'keys: "a" timeout_ms: 0 return_values: true'))
    write(t, "barrier", call(7, "BarrierRequest", 'name: "b" count: 2 timeout_ms: 60000')
          + call(7, "BarrierRequest", 'name: "b" count: 3 timeout_ms: 60000')
          + call(7, "BarrierRequest", 'name: "b" count: 2 timeout_ms: 60000'))
    write(t, "epoch_hint", join("10.0.0.2:7070", "b") + report(1, "b", "k", 4294967294)
          + call(4, "KvGetRequest", 'key: "hsdp/epoch/k"'))


def kv_seeds():
    t = "kv_store_fuzz"
    write(t, "set_get", rec(0, b"\x01\x00value") + rec(2, b"\x01\x00") + rec(1, b"\x01\x00other"))
    write(t, "fill", b"".join(rec(0, bytes([i, 0]) + b"x" * 40) for i in range(10)))
    write(t, "counter", rec(4, b"\x02\x00" + struct.pack("<q", 5)) + rec(4, b"\x02\x00"
          + struct.pack("<q", 2**63 - 1)) + rec(8, b"\x03\x00" + struct.pack("<q", -7))
          + rec(4, b"\x03\x00" + struct.pack("<q", -2**63)))
    write(t, "wait_then_set", rec(5, b"\x04\x02") + rec(0, b"\x04\x00a") + rec(0, b"\x05\x00b")
          + rec(0, b"\x06\x00c"))
    write(t, "wait_expired", rec(5, b"\x04\x01") + rec(3, b"\x00\x07"))
    write(t, "barrier", rec(6, b"\x01\x02") + rec(6, b"\x01\x02") + rec(6, b"\x01\x03")
          + rec(6, b"\x02\x00"))
    write(t, "long_key", rec(7, b"\x00\x00" + b"k" * 30) + rec(7, b"\x00\x00"))
    write(t, "waiters_full", b"".join(rec(5, bytes([i, 0])) for i in range(6)))


def grpc_seeds():
    t = "grpc_handlers_fuzz"
    def call(op, uid, message, text, proto):
        return rec(op, bytes([uid]) + encode(message, text, proto))
    N, A, D = "hsdp/v1/node.proto", "hsdp/v1/admin.proto", "hsdp/v1/device.proto"
    attach = lambda uid, job, rank, world, extra="": call(
        0, uid, "hsdp.v1.AttachRequest", f'job_id: "{job}" rank: {rank} world_size: {world} '
        f'device: "cpu" pid: 1 protocol_version: 2 features: 7 {extra}', N)
    status = lambda uid: call(5, uid, "hsdp.v1.StatusRequest", "", A)
    claim = lambda s: rec(17, bytes([0, s - 1]))
    fd = lambda uid, s, tag, size, dev=0: rec(16, bytes([uid, s - 1]) + struct.pack("<QHB", tag, size - 1, dev))
    write(t, "attach_status", attach(1, "j", 0, 2) + attach(2, "j", 0, 1) + attach(0, "j", 1, 2,
          "owner_uid: 1000") + status(1) + status(2) + status(0))
    write(t, "register_buffer", attach(1, "j", 0, 1) + claim(1) + fd(1, 1, 7, 4096)
          + call(2, 1, "hsdp.v1.RegisterBufferRequest", 'session_id: 1 fd_tag: 7 size_bytes: 4096 name: "b"', N)
          + call(3, 1, "hsdp.v1.FreeBufferRequest", "session_id: 1 buffer_id: 1", N) + status(1))
    write(t, "register_waits", attach(1, "j", 0, 1) + claim(1)
          + call(2, 1, "hsdp.v1.RegisterBufferRequest", 'session_id: 1 fd_tag: 9 size_bytes: 64', N)
          + call(1, 1, "hsdp.v1.DetachRequest", "session_id: 1", N))
    write(t, "new_group", attach(1, "j", 0, 2) + attach(1, "j", 1, 2) + claim(1) + claim(2)
          + call(4, 1, "hsdp.v1.NewGroupRequest", "session_id: 1 ranks: 0 ranks: 1", N)
          + call(4, 1, "hsdp.v1.NewGroupRequest", "session_id: 2 ranks: 0 ranks: 1", N)
          + call(4, 1, "hsdp.v1.NewGroupRequest", "session_id: 2 rejoin_group_id: 1", N)
          + call(9, 1, "hsdp.v1.ActivityRequest", "", A)
          + call(8, 1, "hsdp.v1.StragglersRequest", "", A))
    write(t, "other_uid", attach(1, "j", 0, 1) + call(1, 2, "hsdp.v1.DetachRequest", "session_id: 1", N)
          + call(4, 2, "hsdp.v1.NewGroupRequest", "session_id: 1 ranks: 0", N) + status(2))
    write(t, "admin", call(6, 0, "hsdp.v1.GetConfigRequest", "", A)
          + call(7, 0, "hsdp.v1.TraceRequest", "record_seconds: 1 window_seconds: 1", A)
          + call(10, 1, "grpc.health.v1.HealthCheckRequest", 'service: "hsdp.v1.Node"',
                 "grpc/health/v1/health.proto"))
    write(t, "device", attach(1, "j", 0, 1) + claim(1) + fd(1, 1, 3, 1, 1)
          + call(11, 1, "hsdp.v1.RegisterDeviceBufferRequest",
                 "session_id: 1 handle_kind: DEVICE_HANDLE_VMM_FD device: 0 fd_tag: 3 "
                 "allocation_bytes: 65536 offset_bytes: 0 size_bytes: 4096", D)
          + call(15, 1, "hsdp.v1.GetCompletionEventsRequest", "session_id: 1 device: 0", D)
          + call(13, 1, "hsdp.v1.RegisterDeviceEventRequest", "session_id: 1 device: 0", D)
          + call(12, 1, "hsdp.v1.FreeDeviceBufferRequest", "session_id: 1 buffer_id: 4611686018427387905", D)
          + call(14, 1, "hsdp.v1.FreeDeviceEventRequest", "session_id: 1 event_id: 1", D))


def arena_seeds():
    """arena_fuzz.cc: geometry byte, then records."""
    t = "arena_fuzz"
    two = bytes([1 | (3 << 2)])  # 2 members, 8 slots
    submit = lambda coll=ALL_REDUCE, dtype=F32, count=8, root=0, rop=SUM, wire=0: rec(
        1, struct.pack("<BBHBBB", coll - 1 if coll <= 4 else 4, dtype - 1, count, root, rop - 1, wire))
    lane = lambda m, arrived, consumed: rec(2, struct.pack("<BQQ", m, arrived, consumed))
    write(t, "all_reduce_peer_arrives", two + submit() + lane(1, 1, 0) + rec(3) + rec(6))
    write(t, "geometry_rewritten", two + rec(0, struct.pack("<I", 12) + struct.pack("<IIIQQ", 64, 0, 0, 1 << 40, 2**64 - 1))
          + submit(count=200) + lane(1, 1, 1) + rec(4, b"\x10") + rec(6))
    write(t, "broken_claim_taken", two + rec(0, struct.pack("<I", 132) + struct.pack("<I", 1)) + rec(5, b"\x0e")
          + submit() + rec(6))
    write(t, "broken_word_garbage", two + rec(0, struct.pack("<I", 128) + b"\xff\xff\xff\xff")
          + rec(0, struct.pack("<I", 136) + b"\xff\xff\xff\xff") + submit() + rec(6))
    write(t, "slot_wrap", two + b"".join(submit(count=4) + lane(1, k, k) for k in range(1, 12)) + rec(7))
    write(t, "magic_cleared", two + submit() + rec(0, struct.pack("<I", 0) + bytes(8)) + lane(1, 1, 0) + rec(6))


def main():
    # Files are overwritten, never deleted: the corpora also hold the inputs
    # that found bugs (regress_*, kept by hand) and what fuzz.sh --merge added.
    for f in (descriptor_seeds, dispatcher_seeds, data_conn_seeds, node_config_seeds, cluster_seeds,
              kv_seeds, grpc_seeds, arena_seeds):
        f()
    n = sum(len(files) for _, _, files in os.walk(OUT))
    print(f"make_seeds: {n} seeds in {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
