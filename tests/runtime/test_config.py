import pytest
import torch

from radixlm.runtime.config import ConfigError, EngineConfig


def test_flat_kwargs_are_routed_to_their_component():
    config = EngineConfig.from_kwargs(
        model_path="/m",
        dtype="bfloat16",
        max_total_tokens=100,
        chunked_prefill_size=64,
        num_threads=1,
        random_seed=3,
        grammar_backend="xgrammar",
        jump_forward=True,
    )
    assert config.model.model_path == "/m" and config.model.dtype == "bfloat16"
    assert config.cache.max_total_tokens == 100
    assert config.scheduler.chunked_prefill_size == 64
    assert config.num_threads == 1 and config.random_seed == 3
    assert config.grammar.grammar_backend == "xgrammar" and config.grammar.jump_forward


def test_grammar_mask_threads_default_to_the_engines_choice():
    assert EngineConfig().scheduler.grammar_mask_threads is None
    assert EngineConfig.from_kwargs(grammar_mask_threads=4).scheduler.grammar_mask_threads == 4


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"bogus": 1}, "bogus"),
        ({"dtype": "float8"}, "dtype"),
        ({"max_total_tokens": 0}, "max_total_tokens"),
        ({"chunked_prefill_size": -5}, "chunked_prefill_size"),
        ({"num_threads": True}, "num_threads"),
        ({"kv_memory_gb": 0}, "kv_memory_gb"),
        ({"device": "tpu"}, "device"),
        ({"grammar_backend": "guidance"}, "grammar_backend"),
        ({"grammar_compile_timeout": 0}, "grammar_compile_timeout"),
        ({"grammar_cache_size": 0}, "grammar_cache_size"),
        ({"jump_forward": "yes"}, "jump_forward"),
        ({"attention_backend": "flash"}, "attention_backend"),
        ({"kv_memory_gb": True}, "kv_memory_gb"),
        ({"mem_fraction_static": 1.0}, "mem_fraction_static"),
        ({"mem_fraction_static": 0}, "mem_fraction_static"),
        ({"disable_cuda_graph": "yes"}, "disable_cuda_graph"),
        ({"cuda_graph_max_bs": 0}, "cuda_graph_max_bs"),
        ({"cpu_layer_kernels": "no"}, "cpu_layer_kernels"),
        ({"grammar_mask_threads": 0}, "grammar_mask_threads must be an integer >= 1, got 0"),
        ({"grammar_mask_threads": 2.0}, "grammar_mask_threads must be .*, got 2.0"),
        ({"grammar_mask_threads": True}, "grammar_mask_threads"),
        (
            {"kv_cache_dtype": "kivi4", "enable_torch_compile": True},
            "kv_cache_dtype='kivi4' cannot run with enable_torch_compile",
        ),
        (
            {"kv_cache_dtype": "kivi2", "speculative": "ngram"},
            "kv_cache_dtype='kivi2' cannot run with speculative='ngram'",
        ),
        (
            {"kv_cache_dtype": "int4"},
            "kv_cache_dtype must be one of auto, int8, fp8_e4m3, fp8_e5m2, kivi4, kivi2, "
            "got 'int4'",
        ),
    ],
)
def test_bad_options_name_the_field(kwargs, names):
    with pytest.raises(ConfigError, match=names) as info:
        EngineConfig.from_kwargs(**kwargs)
    assert isinstance(info.value, ValueError)


def test_every_leaf_option_is_a_cli_flag():
    from radixlm.runtime.entrypoints.cli import _build_parser

    help_text = _build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    for field in EngineConfig.flat_fields():
        assert "--" + field.name.replace("_", "-") in help_text


def test_kv_cache_dtype_is_a_cache_option():
    from radixlm.runtime import config
    from radixlm.runtime.mem_cache import kv_quant

    assert config.KV_CACHE_DTYPES == kv_quant.KV_CACHE_DTYPES  # one list of formats
    assert EngineConfig().cache.kv_cache_dtype == "auto"
    assert EngineConfig.from_kwargs(kv_cache_dtype="int8").cache.kv_cache_dtype == "int8"


def test_a_kivi_pool_whose_windows_fill_the_budget_is_refused_naming_them(default_model_dir):
    from radixlm.runtime.executor.model_shard import kv_capacity
    from radixlm.runtime.models.config import ArchConfig

    arch = ArchConfig.from_model_dir(default_model_dir)
    config = EngineConfig.from_kwargs(kv_cache_dtype="kivi4", kv_memory_gb=0.05)
    with pytest.raises(ConfigError, match="float windows .* 128 request rows"):
        kv_capacity(config, arch, torch.bfloat16, "cpu")
    roomy = EngineConfig.from_kwargs(
        kv_cache_dtype="kivi4", kv_memory_gb=0.05, max_running_requests=8
    )
    assert kv_capacity(roomy, arch, torch.bfloat16, "cpu") > 0
