"""torchtitan runs for the tests and the benchmark: arguments, log parsing."""
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ENTRY = os.path.join(HERE, "titan_entry.py")
STEP_RE = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+).*?tps:\s*([\d,]+)")


def titan_args(assets, dump, config="debugmodel_cpu", steps=3, seq_len=64, batch=2,
               shard=-1, replicate=1, checkpoint=False, extra=()):
    data_dir, tok_dir = assets
    args = [ENTRY, "--module", "titan_configs", "--config", config,
            "--hf_assets_path", tok_dir, "--dataloader.dataset_path", data_dir,
            "--training.local_batch_size", str(batch), "--training.seq_len", str(seq_len),
            "--training.steps", str(steps), "--metrics.log_freq", "1",
            "--metrics.disable_color_printing", "--debug.seed", "42",
            "--parallelism.data_parallel_shard_degree", str(shard),
            "--parallelism.data_parallel_replicate_degree", str(replicate),
            "--dump_folder", dump]
    if checkpoint:
        args += ["--checkpoint.enable"]
    return args + list(extra)


def steps_of(output):
    """{step: (loss, grad_norm)} as torchtitan printed them (rank 0's lines; ranks agree)."""
    out = {}
    for m in STEP_RE.finditer(output):
        out.setdefault(int(m.group(1)), (m.group(2), m.group(3)))
    return out
