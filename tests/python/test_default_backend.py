"""hsdpd as the backend torch's defaults resolve to (docs/torch-defaults.md):
stock scripts that never name a backend, run with `python -m hsdp.run`
(hsdprun = torchrun + HSDP_DEFAULT_BACKEND=1 + the hsdp/_boot bootstrap)
against the session's hsdpd, are served by it; without the variable torch's
map is unchanged and hsdp is not even imported; the wheel's `torch.backends`
entry point (a stand-in dist-info here) does the same as the bootstrap;
HSDP_REPLACE_GLOO=1 serves groups named "gloo"; the bootstrap chains to the
sitecustomize it shadows.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# One launch exercises the three ways a script lets torch choose: init_process_group()
# with no backend, torchtitan's init_process_group(backend=default_device_backend_map[
# "cpu"]), and a device mesh without a default group. Each all-reduces 1 MiB (above the
# daemon's small-op arena, so hsdpd's own operation counter sees it).
STOCK = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.distributed import Backend
    from torch.distributed.device_mesh import init_device_mesh

    out = {"map": dict(Backend.default_device_backend_map),
           "hsdp_imported": "hsdp.torch" in sys.modules}
    N = 1 << 18  # float32: 1 MiB

    def check(tag, group=None):
        pg = group or dist.group.WORLD
        t = torch.full((N,), float(dist.get_rank() + 1))
        dist.all_reduce(t, group=pg)
        out[tag] = {"name": pg.name(), "type": type(pg).__name__,
                    "sum_ok": bool((t == 3.0).all()),
                    "ops": pg.hsdp_stats()["ops"] if hasattr(pg, "hsdp_stats") else None}

    dist.init_process_group()
    check("no_backend")
    dist.destroy_process_group()
    dist.init_process_group(backend=Backend.default_device_backend_map["cpu"])
    check("titan_style")
    dist.destroy_process_group()
    mesh = init_device_mesh("cpu", (2,))
    check("device_mesh", mesh.get_group())
    out["default_after_mesh"] = dist.group.WORLD.name()
    dist.destroy_process_group()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(out, f)
""")

GLOO = textwrap.dedent("""
    import json, os
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    out = {"get_backend": dist.get_backend(), "name": dist.group.WORLD.name(),
           "sum_ok": bool((t == 2.0).all())}
    dist.destroy_process_group()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(out, f)
""")

PROBE = textwrap.dedent("""
    import json, os, sys
    exec(os.environ.get("PROBE_FIRST", ""))  # the script's first import, if any
    import torch
    import torch.distributed as dist
    print(json.dumps({"map": dict(dist.Backend.default_device_backend_map),
                      "hsdp_imported": "hsdp" in sys.modules,
                      "hsdpd_registered": "HSDPD" in dist.Backend._plugins,
                      "chained": sys.modules.get("_hsdp_chained_sitecustomize") is not None}))
""")


def _env(**changes):
    env = dict(os.environ)
    for k in ("HSDP_DEFAULT_BACKEND", "HSDP_REPLACE_GLOO", "TORCH_DEVICE_BACKEND_AUTOLOAD"):
        env.pop(k, None)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _hsdprun(tmp_path, script, nproc=2, **env):
    path = tmp_path / "script.py"
    path.write_text(script)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "hsdp.run", "--standalone", "--nproc-per-node", str(nproc),
           str(path)]
    proc = subprocess.run(cmd, env=_env(OUT_DIR=str(out), **env), cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"hsdprun failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def _daemon_ops(hsdpd):
    ctl = os.path.join(os.environ.get("HSDP_BUILD_DIR", os.path.join(HERE, "..", "..", "build")),
                       "bin", "hsdpctl")
    res = subprocess.run([ctl, "--socket", hsdpd.socket, "--json", "status"],
                         capture_output=True, text=True, timeout=30, check=True)
    return int(json.loads(res.stdout)["ops_completed"])


def _probe(tmp_path, pythonpath_first=(), **env):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    e = _env(**env)
    e["PYTHONPATH"] = os.pathsep.join(list(pythonpath_first) + [e.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(path)], env=e, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _wheel_entry_point_installed():
    """True where an installed hsdp wheel declares the torch.backends entry point (its
    module, hence hsdp, is then imported with every torch, variable or not)."""
    from importlib.metadata import entry_points
    return any(ep.name == "hsdpd" for ep in entry_points(group="torch.backends"))


def _boot_dir():
    import hsdp.run
    return hsdp.run.BOOT_DIR


def test_hsdprun_makes_stock_scripts_use_hsdpd(hsdpd, tmp_path):
    before = _daemon_ops(hsdpd)
    results = _hsdprun(tmp_path, STOCK)
    for r in results:
        assert r["map"]["cpu"] == "hsdpd" and r["map"]["cuda"] == "nccl", r
        assert r["hsdp_imported"], "the bootstrap imports hsdp.torch with torch"
        for tag in ("no_backend", "titan_style", "device_mesh"):
            assert r[tag]["name"] == "hsdpd" and r[tag]["type"] == "ProcessGroupHsdp", (tag, r)
            assert r[tag]["sum_ok"], (tag, r)
            assert r[tag]["ops"] >= 1, (tag, r)
        assert r["default_after_mesh"] == "hsdpd"
    # Three 1 MiB all-reduces of two ranks went through the daemon's engine.
    assert _daemon_ops(hsdpd) - before >= 3


def test_without_the_variable_nothing_changes(tmp_path):
    # torch's map as a fresh process has it (this pytest process's map may hold what
    # other tests registered, e.g. a fake "hpu" backend).
    stock = _probe(tmp_path)["map"]
    # The bootstrap on the path but no HSDP_DEFAULT_BACKEND: torch's map as shipped,
    # and hsdp not imported at all.
    r = _probe(tmp_path, [_boot_dir()])
    assert r["map"] == stock and r["map"]["cpu"] == "gloo", r
    if not _wheel_entry_point_installed():
        assert not r["hsdp_imported"] and not r["hsdpd_registered"], r
    # "0" is off too.
    r = _probe(tmp_path, [_boot_dir()], HSDP_DEFAULT_BACKEND="0")
    assert r["map"]["cpu"] == "gloo", r
    # The variable with the bootstrap: hsdpd is cpu's default as soon as torch is imported.
    r = _probe(tmp_path, [_boot_dir()], HSDP_DEFAULT_BACKEND="1")
    assert r["map"]["cpu"] == "hsdpd" and r["map"]["cuda"] == "nccl", r


def _entry_point_dir(tmp_path):
    """A dist-info declaring the wheel's entry point (pyproject.toml), for this checkout."""
    d = tmp_path / "ep" / "hsdp_entry_point_test-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: hsdp-entry-point-test\n"
                                "Version: 0.0\n")
    (d / "entry_points.txt").write_text(
        "[torch.backends]\nhsdpd = hsdp_autoload:autoload\n")
    return str(tmp_path / "ep")


def test_torch_backends_entry_point(tmp_path):
    ep = _entry_point_dir(tmp_path)
    # torch runs it at the end of its own import: hsdp.torch imports fine there.
    r = _probe(tmp_path, [ep], HSDP_DEFAULT_BACKEND="1")
    assert r["map"]["cpu"] == "hsdpd", r
    # Without the variable the map is torch's and hsdp is not even imported: torch
    # imports the entry point's module with every `import torch`, and that module
    # (hsdp_autoload) imports nothing then.
    r = _probe(tmp_path, [ep])
    assert r["map"]["cpu"] == "gloo", r
    assert not r["hsdp_imported"] and not r["hsdpd_registered"], r
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0, torch's switch for every such plugin.
    r = _probe(tmp_path, [ep], HSDP_DEFAULT_BACKEND="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r["map"]["cpu"] == "gloo" and not r["hsdp_imported"], r


@pytest.mark.parametrize("first", ["import hsdp", "import hsdp.torch", "import torch"])
def test_any_first_import_gets_the_default(tmp_path, first):
    """hsdp imports torch while it initialises: when a script's first import is hsdp's,
    torch's plugin hook runs inside hsdp's own import, and the step is finished at the
    end of it (hsdp/__init__.py) instead of failing the import."""
    for path in ([_boot_dir()], [_entry_point_dir(tmp_path / first.replace(" ", "_"))]):
        r = _probe(tmp_path, path, HSDP_DEFAULT_BACKEND="1", PROBE_FIRST=first)
        assert r["map"]["cpu"] == "hsdpd" and r["hsdpd_registered"], (path, r)


def test_bad_value_is_a_clear_error(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    e = _env(HSDP_DEFAULT_BACKEND="tpu")
    e["PYTHONPATH"] = os.pathsep.join([_boot_dir(), e.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(path)], env=e, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0
    assert "HSDP_DEFAULT_BACKEND='tpu'" in res.stderr and "cpu, cuda" in res.stderr, \
        res.stderr[-3000:]


def test_bootstrap_chains_to_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "site_other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nos.environ['SITE_OTHER_RAN'] = '1'\n")
    r = _probe(tmp_path, [_boot_dir(), str(other)], HSDP_DEFAULT_BACKEND="1")
    assert r["chained"] and r["map"]["cpu"] == "hsdpd", r


def test_replace_gloo_serves_gloo_groups(hsdpd, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = _hsdprun(tmp_path / "a", GLOO)
    for r in plain:  # hsdprun alone leaves the name "gloo" to Gloo
        assert r["get_backend"] == "gloo" and r["name"] == "gloo" and r["sum_ok"], r
    replaced = _hsdprun(tmp_path / "b", GLOO, HSDP_REPLACE_GLOO="1")
    for r in replaced:
        assert r["get_backend"] == "gloo" and r["name"] == "hsdpd" and r["sum_ok"], r


def test_enable_is_idempotent_and_disable_restores():
    import torch.distributed as dist
    from hsdp.torch import autoload
    stock = dict(dist.Backend.default_device_backend_map)
    dist.Backend._ensure_backend_registered("gloo")
    gloo = dist.Backend._plugins["GLOO"]
    try:
        assert autoload.enable(("cpu",), replace_gloo_backend=True) == ["cpu"]
        assert autoload.enable(("cpu",), replace_gloo_backend=True) == ["cpu"]
        assert dist.Backend.default_device_backend_map["cpu"] == "hsdpd"
        # cuda is mapped only where "hsdpd" is registered for it (a GPU machine).
        mapped = autoload.enable(("cpu", "cuda"))
        assert ("cuda" in mapped) == ("cuda" in dist.Backend.backend_capability["hsdpd"])
        assert dist.Backend._plugins["GLOO"] is not gloo
    finally:
        autoload.disable()
    assert dict(dist.Backend.default_device_backend_map) == stock
    assert dist.Backend._plugins["GLOO"] is gloo
    assert autoload.requested_devices("") == () and autoload.requested_devices("0") == ()
    assert autoload.requested_devices("1") == ("cpu",)
    assert autoload.requested_devices("cpu, cuda") == ("cpu", "cuda")
    with pytest.raises(ValueError, match="HSDP_DEFAULT_BACKEND"):
        autoload.requested_devices("gpu")


def test_registration_by_name_through_torch_entry_points(hsdpd, tmp_path):
    """torch 2.15 looks a backend it does not know up by name in the entry point group
    `torch.distributed.backends` (its own built-ins are registered that way):
    hsdp.torch.backend:register works as that registrar, so init_process_group("hsdpd")
    needs no `import hsdp.torch` where a wheel declares it."""
    d = tmp_path / "ep" / "hsdp_by_name_test-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: hsdp-by-name-test\n"
                                "Version: 0.0\n")
    (d / "entry_points.txt").write_text(
        "[torch.distributed.backends]\nhsdpd = hsdp.torch.backend:register\n")
    script = tmp_path / "by_name.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        import torch
        import torch.distributed as dist
        before = "hsdp" in sys.modules
        dist.init_process_group("hsdpd", init_method="file://{tmp_path}/store", rank=0,
                                world_size=1)
        t = torch.ones(3)
        dist.all_reduce(t)
        print(json.dumps({{"before": before, "name": dist.group.WORLD.name(),
                           "ok": t.tolist() == [1.0, 1.0, 1.0]}}))
        dist.destroy_process_group()
    """))
    e = _env()
    e["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "ep"), e.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-4000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r == {"before": _wheel_entry_point_installed(), "name": "hsdpd", "ok": True}, r
