"""The ``radixlm`` command: ``pull`` a model (by hub id, or the default one), ``run`` a
chat with it in the terminal, ``generate`` from the shell, ``serve`` over HTTP
(``--dp N``: N replicas behind SGLang's router), measure a model's ``perplexity``,
list the ``models`` it serves.

Engine flags are derived from ``EngineConfig``'s fields, server flags from
``ServerConfig``'s, the replica flags from ``FleetConfig``'s and ``run`` /
``generate``'s sampling flags from the sampling table (``cli_sampling``), not written
by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import types
import typing
from collections.abc import Sequence

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.distributed.ranks import serve_node
from radixlm.runtime.entrypoints.chat import ChatSession, read_terminal_line
from radixlm.runtime.entrypoints.cli_sampling import (
    GENERATE_DEFAULTS,
    RUN_DEFAULTS,
    add_sampling_flags,
    sampling_params,
)
from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.entrypoints.fleet import FleetConfig, serve_fleet
from radixlm.runtime.entrypoints.http import ServerConfig, serve
from radixlm.runtime.entrypoints.perplexity import (
    DEFAULT_TEXT,
    PerplexityError,
    measure_perplexity,
)
from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.executor.model_shard import CPU_KV_MEMORY_GB, kv_capacity
from radixlm.runtime.mem_cache.kv_quant import KV_CACHE_DTYPES, kv_format
from radixlm.runtime.model_store import pull_default_model, resolve_model_source
from radixlm.runtime.model_store.hub import parse_hub_id
from radixlm.runtime.models import REFUSED_ARCHITECTURES, ArchConfig, architecture_features
from radixlm.runtime.models.build import quantized_checkpoint, resolve_dtype
from radixlm.runtime.models.checkpoint_formats import read_checkpoint_quantization

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # our errors for bad input: one clear line, no traceback
        print(f"radixlm: error: {e}", file=sys.stderr)
        return 2


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm", description=__doc__)
    sub = parser.add_subparsers(required=True, dest="command")
    pull = sub.add_parser("pull", help="download a model (by hub id), or the default model")
    pull.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a hub id: ORG/NAME or ORG/NAME-GGUF:QUANT (default: the embedded default model)",
    )
    pull.add_argument("--revision", default=None, help="a hub model's branch, tag or commit")
    pull.add_argument("--gguf-file", default=None, help="the GGUF file of a hub repository")
    pull.add_argument(
        "--force", action="store_true", help="the default model: convert again even if present"
    )
    pull.set_defaults(func=_pull)
    run = sub.add_parser("run", help="chat with a model in the terminal (/bye to leave)")
    run.add_argument(
        "model", nargs="?", default=None, help="a hub id or path (default: the default model)"
    )
    add_sampling_flags(run, RUN_DEFAULTS)
    run.add_argument(
        "--verbose", action="store_true", help="print each reply's prompt, cached and new tokens"
    )
    _add_engine_flags(run)
    run.set_defaults(func=_run)
    gen = sub.add_parser("generate", help="stream a completion to the terminal")
    gen.add_argument("prompt")
    add_sampling_flags(gen, GENERATE_DEFAULTS)
    gen.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as is (default: wrap it in the chat template)",
    )
    _add_engine_flags(gen)
    gen.set_defaults(func=_generate)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible and native HTTP API")
    _add_config_flags(serve, "server options", _server_fields(), "server_")
    _add_config_flags(serve, "replicas behind SGLang's router", _fleet_fields(), "fleet_")
    _add_engine_flags(serve)
    serve.set_defaults(func=_serve)
    ppl = sub.add_parser("perplexity", help="perplexity of a text (llama.cpp's method)")
    ppl.add_argument("--text", default=None, help="a UTF-8 text file (default: The Tempest)")
    ppl.add_argument("--context", type=int, default=512, help="tokens per window")
    ppl.add_argument("--max-windows", type=int, default=None, help="score only the first N")
    _add_engine_flags(ppl)
    ppl.set_defaults(func=_perplexity)
    models = sub.add_parser("models", help="the model architectures radixlm serves")
    models.add_argument(
        "--check",
        metavar="PATH",
        default=None,
        help="a model directory, .gguf file or hub id: say whether it is served, and how",
    )
    models.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="--check: the KV pool's format to size (default: auto, the model's dtype)",
    )
    models.add_argument(
        "--kv-memory-gb",
        type=float,
        default=CPU_KV_MEMORY_GB,
        help=f"--check: the KV pool's memory (default: {CPU_KV_MEMORY_GB}, a CPU's)",
    )
    models.add_argument(
        "--dtype", default="auto", help="--check: the model's dtype (default: auto, on this CPU)"
    )
    models.set_defaults(func=_models)
    return parser


def _server_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(ServerConfig))


def _fleet_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(FleetConfig))


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    _add_config_flags(parser, "engine options", EngineConfig.flat_fields(), "engine_")


# SGLang's spellings (and short ones), accepted beside the derived flag
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "tp_size": ("--tp",),
    "dp_size": ("--dp",),
    "speculative": ("--speculative-algorithm",),
    "speculative_num_tokens": ("--speculative-num-draft-tokens",),
    "speculative_draft_model_path": ("--draft-model-path",),
}

# fields whose values are a fixed set: argparse names the flag and the choices
FLAG_CHOICES: dict[str, tuple[str, ...]] = {
    "kv_cache_dtype": KV_CACHE_DTYPES,
}


def _add_config_flags(
    parser: argparse.ArgumentParser, title: str, fields: list[dataclasses.Field], prefix: str
) -> None:
    """One --flag per config field (and its ``FLAG_ALIASES``); its value lands in
    ``args.<prefix><field name>``."""
    group = parser.add_argument_group(title)
    for field in fields:
        flags = ["--" + field.name.replace("_", "-"), *FLAG_ALIASES.get(field.name, ())]
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.type in (bool, "bool"):
            group.add_argument(
                *flags,
                dest=f"{prefix}{field.name}",
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"(default: {default})",
            )
            continue
        if _is_repeated(field.type):  # str | tuple[str, ...]: the flag may come again
            group.add_argument(
                *flags,
                dest=f"{prefix}{field.name}",
                action="append",
                default=default,
                help=f"(repeatable; default: {default})",
            )
            continue
        group.add_argument(
            *flags,
            dest=f"{prefix}{field.name}",
            type=_scalar_type(field.type),
            choices=FLAG_CHOICES.get(field.name),
            default=default,
            help=f"(default: {default})",
        )


def _is_repeated(annotation: object) -> bool:
    """Whether a field takes a tuple of values (``str | tuple[str, ...] | None``)."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "tuple[" in text


def _scalar_type(annotation: object) -> type:
    """int | None -> int, "float" -> float, Literal[...] -> str."""
    hints = {"int": int, "float": float, "str": str, "bool": bool}
    if isinstance(annotation, str):
        for name, typ in hints.items():
            if annotation.startswith(name):
                return typ
        return str
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and args:
        return _scalar_type(args[0])
    return annotation if isinstance(annotation, type) else str


def _engine_kwargs(args: argparse.Namespace) -> dict:
    return _prefixed(args, "engine_")


def _prefixed(args: argparse.Namespace, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix)}


def _models(args: argparse.Namespace) -> int:
    """Prints the served architectures with their features and the refused ones with
    what they lack; ``--check PATH`` reads one model's config instead (a ModelLoadError,
    naming what is missing, when it is refused)."""
    if args.check is not None:
        print(_describe_model(args.check))
        print(_describe_kv_pool(args.check, args.kv_cache_dtype, args.kv_memory_gb, args.dtype))
        return 0
    served = architecture_features()
    width = max(map(len, [*served, *REFUSED_ARCHITECTURES]))
    print("served (from a Hugging Face directory or a GGUF file):")
    for name, features in served.items():
        print(f"  {name:<{width}}  {features}")
    print("refused (the piece radixlm lacks):")
    for name, missing in REFUSED_ARCHITECTURES.items():
        print(f"  {name:<{width}}  {missing}")
    return 0


def _describe_model(path: str) -> str:
    """One model's architecture, the switches radixlm reads from it and its weights'
    quantization (QuantizedCheckpointError, naming the field, for one not served)."""
    model_dir = resolve_model_source(path).model_dir
    arch = ArchConfig.from_model_dir(model_dir)
    checkpoint = read_checkpoint_quantization(model_dir)
    facts = [
        f"{arch.num_layers} layers",
        f"hidden {arch.hidden_size}",
        f"{arch.num_heads} heads ({arch.num_kv_heads} KV) of {arch.head_dim}",
        f"RoPE {arch.rope_scaling.rope_type}"
        + (f" over {arch.rotary_dims} dims" if arch.rotary_dims != arch.head_dim else ""),
        f"MLP {arch.hidden_act}",
    ]
    if arch.sliding_window is not None:
        sliding = sum(w is not None for w in arch.layer_windows)
        facts.append(f"sliding window {arch.sliding_window} on {sliding} layers")
    if arch.attn_logit_softcap or arch.final_logit_softcap:
        facts.append(f"soft-caps {arch.attn_logit_softcap} / {arch.final_logit_softcap}")
    if arch.moe is not None:
        moe = arch.moe
        shared = ", a shared expert" if moe.shared_expert_size else ""
        facts.append(
            f"{moe.num_experts} experts, top {moe.top_k} on {len(moe.sparse_layers)} layers"
            + shared
        )
    if checkpoint is not None:
        facts.append(f"weights {checkpoint.describe()}")
    return f"{path}: {arch.architecture}, served: " + ", ".join(facts)


def _describe_kv_pool(path: str, kv_cache_dtype: str, kv_memory_gb: float, dtype: str) -> str:
    """The KV pool the model gets on this CPU: its format, one token's bytes (every
    layer's K and V, scales included) and the tokens ``kv_memory_gb`` holds."""
    config = EngineConfig.from_kwargs(
        model_path=path, dtype=dtype, kv_cache_dtype=kv_cache_dtype, kv_memory_gb=kv_memory_gb
    )
    source = resolve_model_source(path)
    arch = ArchConfig.from_model_dir(source.model_dir)
    model_dtype = resolve_dtype(dtype, "cpu", quantized=quantized_checkpoint(source))
    fmt = kv_format(kv_cache_dtype, model_dtype)
    per_token = fmt.bytes_per_token(arch.num_layers, arch.num_kv_heads, arch.head_dim)
    tokens = kv_capacity(config, arch, model_dtype, "cpu")
    described = (
        f"KV cache: {fmt.name}, {per_token:,} bytes per token, "
        f"{tokens:,} tokens in {kv_memory_gb:g} GiB"
    )
    if fmt.kivi is not None:
        rows = config.scheduler.max_running_requests
        shape = (arch.num_layers, rows, arch.num_kv_heads, arch.head_dim)
        windows = fmt.kivi.window_bytes(*shape, model_dtype)
        described += f" beside the float windows of {rows} requests ({windows / 2**20:,.1f} MiB)"
    return described


def _pull(args: argparse.Namespace) -> int:
    if args.model is None:
        path = pull_default_model(force=args.force, progress=True)
        print(f"default model ready: {path}")
        return 0
    if parse_hub_id(args.model) is None:
        raise ModelLoadError(f"{args.model!r} is no hub id: name a model as ORG/NAME[:QUANT]")
    source = resolve_model_source(args.model, revision=args.revision, gguf_file=args.gguf_file)
    print(f"{source.name} ready: {source.path}")
    return 0


def _run(args: argparse.Namespace) -> int:
    options = _engine_kwargs(args)
    if args.model is not None:
        if options.get("model_path") is not None:
            raise ModelLoadError("name the model once: as NAME or with --model-path")
        options["model_path"] = args.model
    params = sampling_params(args)
    if sys.stdin.isatty():
        # Ctrl-C stops a reply even when this process started with SIGINT ignored (as a
        # non-interactive shell starts a background job; Python then keeps ignoring it)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with Engine(**options) as engine:
        session = ChatSession(engine, params, args.verbose)
        return session.run(read_terminal_line if sys.stdin.isatty() else input)


def _generate(args: argparse.Namespace) -> int:
    with Engine(**_engine_kwargs(args)) as engine:
        prompt = args.prompt
        if not args.raw and engine.tokenizer.chat_template:
            prompt = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        for chunk in engine.generate(prompt, sampling_params(args), stream=True):
            print(chunk["delta"], end="", flush=True)
        print()
    return 0


def _perplexity(args: argparse.Namespace) -> int:
    path = args.text or DEFAULT_TEXT
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise PerplexityError(f"cannot read the text {str(path)!r}: {e.strerror}") from e
    with Engine(**_engine_kwargs(args)) as engine:
        result = measure_perplexity(engine, text, args.context, args.max_windows)
    print(result.describe())
    return 0


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = ServerConfig(**_prefixed(args, "server_"))  # bad values raise before the model loads
    fleet = FleetConfig(**_prefixed(args, "fleet_"))
    if fleet.dp_size > 1:  # replicas of this command behind SGLang's router
        return serve_fleet(fleet, config, _engine_kwargs(args))
    engine_config = EngineConfig.from_kwargs(**_engine_kwargs(args))
    if engine_config.parallel.node_rank > 0:  # this node's ranks only compute: node 0 serves
        return serve_node(engine_config)
    return serve(config, _engine_kwargs(args))


if __name__ == "__main__":
    sys.exit(main())
