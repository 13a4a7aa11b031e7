#!/usr/bin/python3
"""The weight path through the services: a trainer (--weights, publishing from memory),
rlfleet-weights (--relay_fanout) and R rollout replicas of a D_MODEL x N_LAYERS policy,
each its own process on loopback. One PublishWeights, then every replica synced at once
VERSIONS times (default 3: the same bytes republished as new versions; the last one is
reported, as a running fleet sees it), (SYNC=all, default: one SyncVersion for all of them, pushed through the resharding
executor in --relay_fanout chains; SYNC=each: one SyncVersion per replica; PUSH=false:
every replica pulls);
prints the round's phases from GetSyncStatus (trainer pause, the weights service's pull
and digest check, each replica's pull / install / round trip and whom it pulled from).

  bazel build -c opt //services/...
  mkdir -p /tmp/rlfleet_py && protoc -I proto --python_out=/tmp/rlfleet_py proto/rlfleet/v1/*.proto
  PYTHONPATH=/tmp/rlfleet_py /usr/bin/python3 bench/weights_service.py 1024 8 3 1   # D_MODEL N_LAYERS R FANOUT

WARM_GIB=N (default 4; 0 = off) first touches and frees N GiB of huge-page memory: on
this VM the first use of memory not touched lately costs ~10x (a fresh 400 MB huge-page
buffer: 780 ms the first time, 48-67 ms right after, in any process), which made the
first pull of each replica in a cold run look slow; a long-running fleet reuses warm
memory. The run says which it measured.
"""
import os, re, subprocess, sys, threading, time
import grpc
from rlfleet.v1 import trainer_pb2, weights_pb2
B = os.environ.get("RLFLEET_BIN", "bazel-bin/services")
MODEL = ["--d_model=%s" % sys.argv[1], "--n_layers=%s" % sys.argv[2], "--n_heads=8", "--threads=1"]
R = int(sys.argv[3]); FAN = sys.argv[4]
SYNC = os.environ.get("SYNC", "all")  # all: one SyncVersion for every replica; each: one per replica
PUSH = os.environ.get("PUSH", "true")  # rlfleet-weights --push
procs = []
WARM_GIB = int(os.environ.get("WARM_GIB", "4"))
if WARM_GIB > 0:
    import mmap
    m = mmap.mmap(-1, WARM_GIB << 30)
    m.madvise(mmap.MADV_HUGEPAGE)
    chunk = b"\1" * (64 << 20)
    for off in range(0, WARM_GIB << 30, 64 << 20):
        m[off:off + (64 << 20)] = chunk
    m.close()
print("memory warm-up: %s" % ("%d GiB touched and freed first" % WARM_GIB if WARM_GIB > 0 else "none (cold)"))
def start(binary, flags):
    p = subprocess.Popen([binary, "--host=127.0.0.1", "--port=0"] + flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(p)
    while True:
        line = p.stdout.readline()
        if not line: raise SystemExit("died: " + binary)
        m = re.search(r"listening on (\S+)", line)
        if m: return m.group(1)
def call(addr, method, req, resp_cls, timeout=300):
    ch = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64<<20)])
    rpc = ch.unary_unary(method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=resp_cls.FromString)
    return rpc(req, timeout=timeout)
try:
    # rlfleet-weights cannot know the model's size before the first publish: tell it
    # (WEIGHTS_PREFAULT_MIB, about the model's f32 size; 0 = off, the first pull then
    # faults in fresh memory). The trainer and replicas size theirs from the model.
    w = start(B + "/weights/rlfleet-weights", ["--relay_fanout=" + FAN, "--push=" + PUSH, "--prefault_mib=" + os.environ.get("WEIGHTS_PREFAULT_MIB", "512")])
    t = start(B + "/trainer/rlfleet-trainer", MODEL + ["--weights=" + w])
    rs = [start(B + "/rollout/rlfleet-rollout", MODEL) for _ in range(R)]
    t0 = time.time()
    pub = call(t, "/rlfleet.v1.TrainerService/PublishWeights", trainer_pb2.PublishWeightsRequest(), trainer_pb2.PublishWeightsResponse)
    t_pub = time.time() - t0
    mb = pub.location.length_bytes / 1e6
    for i, r in enumerate(rs):
        call(w, "/rlfleet.v1.WeightsService/RegisterDestination", weights_pb2.RegisterDestinationRequest(replica_id="r%d" % i, grpc_address=r, can_relay=True), weights_pb2.RegisterDestinationResponse)
    VERSIONS = int(os.environ.get("VERSIONS", "3"))  # versions synced; the last one is reported
    for k in range(VERSIONS):
        if k > 0:  # the same bytes again as the next version, from the trainer's memory
            req = weights_pb2.PublishVersionRequest(publisher_id="bench")
            req.manifest.CopyFrom(pub.manifest)
            req.manifest.version.version = pub.manifest.version.version + k
            req.sources.add().shards.add().location.CopyFrom(pub.location)
            call(w, "/rlfleet.v1.WeightsService/PublishVersion", req, weights_pb2.PublishVersionResponse)
        t1 = time.time()
        if SYNC == "all":  # one SyncVersion for every destination: pushed in relay chains
            call(w, "/rlfleet.v1.WeightsService/SyncVersion", weights_pb2.SyncVersionRequest(commit=True, timeout_ms=300000), weights_pb2.SyncVersionResponse)
        else:  # one SyncVersion per replica, all at once
            ths = [threading.Thread(target=call, args=(w, "/rlfleet.v1.WeightsService/SyncVersion", weights_pb2.SyncVersionRequest(replica_id="r%d" % i, commit=True, timeout_ms=300000), weights_pb2.SyncVersionResponse)) for i in range(R)]
            [x.start() for x in ths]; [x.join() for x in ths]
        t_sync = time.time() - t1
        print("version %d: all %d replicas synced in %.2f s" % (k + 1, R, t_sync))
    st = call(w, "/rlfleet.v1.WeightsService/GetSyncStatus", weights_pb2.GetSyncStatusRequest(), weights_pb2.GetSyncStatusResponse)
    print("model %.1f MB; trainer publish (pause %.1f ms, call incl. weights pull %.2f s, weights pull+verify %.1f ms)" % (mb, st.trainer_pause_us/1e3, t_pub, st.publish_read_us/1e3))
    for d in st.destinations:
        print("  %s %s from %-4s %s %.1f ms (%.2f GB/s; of it memory %.1f ms, digest %.1f ms)  install %.1f ms  round trip %.1f ms" % (d.replica_id, "pushed" if d.pushed else "pulled", d.relayed_from or "here", weights_pb2.SyncPhase.Name(d.phase), d.transfer_us/1e3, d.throughput_gb_per_s, d.pull_allocate_us/1e3, d.pull_verify_us/1e3, d.install_us/1e3, d.round_trip_us/1e3))
    print("version %d (the last): all %d replicas synced in %.2f s (%.2f GB/s of replica bytes)" % (VERSIONS, R, t_sync, R * mb / 1e3 / t_sync))
finally:
    for p in procs: p.terminate()
    for p in procs: p.wait()
    if os.environ.get("LOGS"):  # LOGS=1: what rlfleet-weights logged
        print(procs[0].stdout.read())
