"""torchtitan configurations for the CPU tests and benchmarks: a user's config_registry module
(`--module titan_configs --config <function>`; torchtitan imports a fully qualified module).

Each is torchtitan's own llama3 model, the Llama debug model's layout, with one change that
CPU needs: attention through torch's scaled_dot_product_attention (torchtitan's own
ScaledDotProductAttention; plain causal over the sequence) instead of FlexAttention, whose
backward torch 2.15 does not implement on CPU ("FlexAttention does not support backward on
CPU"; varlen attention is CUDA only). No validation (its dataset is on the Hub).
"""
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel


def _on_cpu(config, dim=None, n_layers=None):
    model = config.model_spec.model
    for layer in model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config.validator.enable = False
    config.checkpoint.interval = 2
    config.lr_scheduler.warmup_steps = 1
    return config


def debugmodel_cpu():
    """The Llama debug model (dim 256, 6 layers, vocab 2048, ~6 M parameters)."""
    return _on_cpu(llama3_debugmodel())


def _scaled(dim, n_layers):
    """The debug model's layout at another width and depth (bench: comm-bound shape)."""
    import torchtitan.models.llama3 as l3
    config = llama3_debugmodel()
    n_heads = 16
    spec = config.model_spec
    m = spec.model
    m.dim = dim
    m.tok_embeddings.embedding_dim = dim
    m.norm.normalized_shape = dim
    m.lm_head.in_features = dim
    m.lm_head.param_init = l3._output_linear_init(dim)
    m.layers = l3._build_llama3_layers(
        fuse_qkv=True, n_layers=n_layers, dim=dim, n_heads=n_heads,
        hidden_dim=l3.compute_ffn_hidden_dim(dim, multiple_of=256),
        rope=l3.ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=131072, theta=500000,
                                   scaling="llama"),
        attn_backend="flex")
    return _on_cpu(config)


def wide_cpu():
    """Communication-bound (benchmarks.md §7's shape): dim 1024, 4 layers, few tokens."""
    return _scaled(1024, 4)
