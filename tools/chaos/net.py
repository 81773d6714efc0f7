"""The chaos run's network in --netns mode: one network namespace per node
(tools/scripts/netns_topology.py: node i's eth0 on 198.18.40.(10+i)/24, its
veth peer n<i> on a bridge in a switch namespace), and the link faults.

    net = Net(owner=os.getpid(), nodes=3)  # up; Net.down() removes it all
    net.prefix(i)          # ["ip", "netns", "exec", <node i's namespace>]
    net.set_link(i, False) # node i's bridge port down (its cable pulled)
    net.shape(i) / net.unshape(i)

The subnet 198.18.40.0/24 is this harness's (other tests use 198.18.0, .1,
.77, .78, .79); every address lives inside namespaces created here, so no
traffic leaves the machine. The owner pid names the namespaces: a later `up`
of any owner removes those of an owner that no longer runs (a chaos run
killed with SIGKILL), and Net.down() runs on every exit of chaos.py.

Shaping a link to a crawl (link_slow): both directions of node i's link,
its eth0 egress (what it sends) and its bridge port's egress (what it
receives), get netem `delay 100ms rate 4mbit` (an RTT of 200 ms more and
500 KB/s). One step of the chaos job sends about 0.2 MB across nodes per
node (the gradients' replica all-reduce of a ~41k-parameter model's shard,
fp32, 2(K-1)/K of it, plus the few small collectives of a step), so a step
should take about a second instead of tens of milliseconds (an estimate;
report.json's step_s_during measures it), while every single
collective stays two orders of magnitude below its 60 s deadline
(timeouts.collective_ms and the process group's timeout): a crawl, not a
failure. On kernels without sch_netem ("Specified qdisc kind is unknown",
as on the 2-core CI machines) the rate alone is shaped, by tbf with 400 ms
of queue (`rate 4mbit burst 32kb latency 400ms`): bursts beyond it are
dropped and TCP's retransmissions (200 ms at least) stand in for the delay.
Net.shaping says which one this kernel got.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import netns_topology  # noqa: E402

SUBNET = "198.18.40"
IP = netns_topology.IP
NETEM = ["netem", "delay", "100ms", "rate", "4mbit"]
TBF = ["tbf", "rate", "4mbit", "burst", "32kb", "latency", "400ms"]


class NetError(RuntimeError):
    pass


def _run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=20)
    if r.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r.stdout


def probe():
    """None when namespaces can be made here, else why not."""
    return netns_topology.probe()


class Net:
    def __init__(self, owner, nodes):
        self.owner = owner
        self.addrs = [f"{SUBNET}.{10 + i}" for i in range(nodes)]
        self.topo = netns_topology.up(owner, [[a] for a in self.addrs], 24)
        try:
            self.shaping = self._probe_netem()
        except BaseException:
            self.down()
            raise

    def namespace(self, i):
        return self.topo["nodes"][i]["namespace"]

    def prefix(self, i):
        return [IP, "netns", "exec", self.namespace(i)]

    def _probe_netem(self):
        """'netem' when this kernel has sch_netem, else 'tbf' (rate only)."""
        ns = self.namespace(0)
        r = subprocess.run([IP, "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
                            "netem", "delay", "1ms"], capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            return "tbf"
        _run([IP, "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root"])
        return "netem"

    def port(self, i):
        """What link_down takes down for node i (the report names it)."""
        return f"bridge port {self.topo['nodes'][i]['switch_port']}"

    def set_link(self, i, up):
        """Node i's port on the bridge up or down (the node's cable)."""
        _run([IP, "-n", self.topo["switch"], "link", "set", self.topo["nodes"][i]["switch_port"],
              "up" if up else "down"])

    def _qdisc_targets(self, i):
        return [(self.namespace(i), "eth0"),
                (self.topo["switch"], self.topo["nodes"][i]["switch_port"])]

    def shape(self, i):
        """Both directions of node i's link to a crawl; returns the qdisc used."""
        q = NETEM if self.shaping == "netem" else TBF
        for ns, dev in self._qdisc_targets(i):
            _run([IP, "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", *q])
        return " ".join(q)

    def unshape(self, i):
        for ns, dev in self._qdisc_targets(i):
            subprocess.run([IP, "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, timeout=20)

    def down(self):
        """Every namespace (and every process still in one), veth and the bridge."""
        netns_topology.down(self.owner)
