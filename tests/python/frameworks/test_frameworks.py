"""Training frameworks run unchanged over hsdpd (docs/frameworks.md): each test launches the
framework's own stock training over Gloo (torchrun) and over hsdpd (`python -m hsdp.run`, the
same arguments; no line of the script names a backend) against a daemon of its own, and
compares the two.

Tolerance: none. Two ranks reduce a+b, which IEEE addition gives bitwise the same in either
order, and AVG divides by 2 exactly, so where Gloo runs the losses (as float.hex) and the
final parameters (a digest) must be bitwise identical. Where Gloo cannot run (torchtitan's
FSDP2: it reduce-scatters with PREMUL_SUM, which Gloo refuses), the check is against hsdpd
itself: a run resumed from torchtitan's own DCP checkpoint must print the uninterrupted run's
loss and grad norm exactly, and torchtitan's DDP mode (which Gloo runs) is compared bitwise.
"""
import json
import os
import shutil

import pytest

import fw_launch
import titan_util

Daemon, BUILD = fw_launch.daemon_class()

HERE = os.path.dirname(os.path.abspath(__file__))
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(os.path.join(BUILD, "bin", "hsdpd"), str(tmp_path))
    yield d
    d.stop()


def _ranks(out_dir, n=2):
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(n)]


def _run_script(daemon, tmp_path, script, backend, env=None):
    out = tmp_path / backend
    out.mkdir()
    fw_launch.launch([os.path.join(HERE, script)], 2, backend, daemon.socket, BUILD,
                     env={"OUT_DIR": str(out), "STEPS": "4", **(env or {})})
    return _ranks(str(out))


def _same_training(gloo, hsdpd):
    for g, h in zip(gloo, hsdpd):
        assert g["group"] == "gloo" and h["group"] == "hsdpd"
        assert len(g["losses"]) == 4
        assert h["losses"] == g["losses"]
    # Rank 0 holds the full parameters (Fabric gathers them there only).
    assert gloo[0]["params_sha256"] == hsdpd[0]["params_sha256"] != EMPTY_SHA256


def test_accelerate_fsdp2_plugin(daemon, tmp_path):
    """Accelerate hard-codes "gloo" on CPU: hsdprun with HSDP_REPLACE_GLOO=1 serves it."""
    gloo = _run_script(daemon, tmp_path, "accelerate_train.py", "gloo")
    ops = fw_launch.daemon_ops(BUILD, daemon.socket)
    hsdpd = _run_script(daemon, tmp_path, "accelerate_train.py", "hsdpd",
                        env={"HSDP_REPLACE_GLOO": "1"})
    # DDP's gradient all-reduces went through the daemon (4 steps; small ones may run in
    # the group's arena, which ops_completed does not count, so at least one per step).
    assert fw_launch.daemon_ops(BUILD, daemon.socket) - ops >= 4
    _same_training(gloo, hsdpd)
    # Accelerate 1.15 honours the FSDP plugin only on accelerators (state.py: FSDP is set for
    # MULTI_GPU/NPU/XPU/...; on CPU it stays MULTI_CPU, i.e. DDP). If this changes, the
    # test still compares bitwise, and docs/frameworks.md must be updated.
    assert {r["distributed_type"] for r in gloo + hsdpd} == {"DistributedType.MULTI_CPU"}


def test_lightning_fabric(daemon, tmp_path):
    """Fabric picks torch's default map: hsdprun alone selects hsdpd; the one-line option
    process_group_backend="hsdpd" does the same under plain torchrun."""
    gloo = _run_script(daemon, tmp_path, "fabric_train.py", "gloo")
    hsdpd = _run_script(daemon, tmp_path, "fabric_train.py", "hsdpd")
    _same_training(gloo, hsdpd)
    out = tmp_path / "option"
    out.mkdir()
    fw_launch.launch([os.path.join(HERE, "fabric_train.py")], 2, "gloo", daemon.socket, BUILD,
                     env={"OUT_DIR": str(out), "STEPS": "4", "FABRIC_PG_BACKEND": "hsdpd"})
    option = _ranks(str(out))
    assert [r["group"] for r in option] == ["hsdpd", "hsdpd"]
    assert [r["losses"] for r in option] == [r["losses"] for r in gloo]
    assert {r["wrapped"] for r in gloo + hsdpd} == {"FSDPSequential"}
    assert {r["data_parallel_size"] for r in gloo + hsdpd + option} == {2}  # sharded over both
    # With no hsdp call: FSDP2's buffers in hsdpd memory, and the reduce-scatters of the
    # three sharded Linears overlapped the rest of backward in each of the 4 steps (Fabric's
    # zero_grad() sets gradients to None; docs/torch-defaults.md).
    for r in hsdpd + option:
        assert r["comm"]["path"] == "hsdpd", r["comm"]
        assert r["comm"]["overlapped"] == 3 * 4, json.dumps(r["comm"])
    assert all("comm" not in r for r in gloo)


@pytest.fixture(scope="module")
def titan_assets(tmp_path_factory):
    import fw_assets
    return fw_assets.make_assets(str(tmp_path_factory.mktemp("titan-assets")))


def _titan(daemon, tmp_path, assets, name, backend, nproc=2, output=None, **kw):
    dump = str(tmp_path / name)
    mapfile = str(tmp_path / f"{name}.map")
    out = fw_launch.launch(titan_util.titan_args(assets, dump, **kw), nproc, backend,
                           daemon.socket, BUILD, env={"FW_MAP_OUT": mapfile},
                           log=str(tmp_path / f"{name}.log"))
    with open(mapfile) as f:
        assert f.read() == backend
    if output is not None:
        output.append(out)
    return titan_util.steps_of(out), dump


def _resume_matches(daemon, tmp_path, assets, steps, at, nproc=2, **kw):
    """A run of `steps` steps with torchtitan's DCP checkpoint every `at` steps, then a run
    given only the checkpoint of step `at`: it starts after it and prints the later steps
    exactly as the first. Returns the first run's output."""
    ops = fw_launch.daemon_ops(BUILD, daemon.socket)
    logs = []
    full, dump = _titan(daemon, tmp_path, assets, "full", "hsdpd", nproc=nproc, output=logs,
                        steps=steps, checkpoint=True,
                        extra=["--checkpoint.interval", str(at)], **kw)
    assert sorted(full) == list(range(1, steps + 1))
    assert fw_launch.daemon_ops(BUILD, daemon.socket) > ops  # the collectives went there
    ckpt = os.path.join(dump, "checkpoint")
    assert os.path.isdir(os.path.join(ckpt, f"step-{at}")), os.listdir(ckpt)
    resumed_dump = tmp_path / "resumed"
    os.makedirs(resumed_dump / "checkpoint")
    shutil.copytree(os.path.join(ckpt, f"step-{at}"), resumed_dump / "checkpoint" / f"step-{at}")
    resumed, _ = _titan(daemon, tmp_path, assets, "resumed", "hsdpd", nproc=nproc, steps=steps,
                        checkpoint=True, extra=["--checkpoint.interval", str(at)], **kw)
    assert sorted(resumed) == list(range(at + 1, steps + 1)), resumed  # after the checkpoint
    for step in resumed:
        assert resumed[step] == full[step], (step, resumed[step], full[step])
    return logs[0]



def test_torchtitan_fsdp2_checkpoint_resume(daemon, tmp_path, titan_assets):
    """torchtitan's Llama debug model, FSDP2 over 2 ranks, through hsdprun; its own DCP
    checkpoint at step 2, a second run resumed from it prints step 3 exactly as the first."""
    out = _resume_matches(daemon, tmp_path, titan_assets, steps=3, at=2)
    assert "Applied FSDP to the model" in out


def test_torchtitan_hsdp_2x2_checkpoint_resume(daemon, tmp_path, titan_assets):
    """HSDP on a 2x2 mesh (2 replicas of 2 shards, 4 ranks): FSDP2's all-gather and
    reduce-scatter within each replica and the all-reduce across replicas, all over hsdpd;
    torchtitan's DCP checkpoint at step 1 of 2 (written by 4 ranks, read back by 4), and the
    resumed run prints step 2 exactly as the uninterrupted one. (Gloo cannot run it:
    PREMUL_SUM; one step of a resumed HSDP run reproduced bitwise is the reference.)"""
    out = _resume_matches(daemon, tmp_path, titan_assets, steps=2, at=1, nproc=4,
                          shard=2, replicate=2)
    assert "Applied HSDP to the model" in out


def test_torchtitan_ddp_against_gloo(daemon, tmp_path, titan_assets):
    """torchtitan's DDP mode (replicate 2) runs on Gloo: hsdpd prints the same steps bitwise.
    (Its FSDP2 and HSDP modes do not run on Gloo: PREMUL_SUM.)"""
    kw = dict(steps=2, shard=1, replicate=2)
    gloo, _ = _titan(daemon, tmp_path, titan_assets, "gloo", "gloo", **kw)
    hsdpd, _ = _titan(daemon, tmp_path, titan_assets, "hsdpd", "hsdpd", **kw)
    assert sorted(gloo) == [1, 2]
    assert hsdpd == gloo
