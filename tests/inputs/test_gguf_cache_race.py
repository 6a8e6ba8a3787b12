"""Two processes converting the same GGUF at once (two test workers, two users on one cache): the one that finishes
second keeps the first one's folder instead of deleting it under the other's feet."""

from __future__ import annotations

import types

from specconvert.models import sources


def test_a_conversion_finished_meanwhile_by_another_process_is_kept(tmp_path, monkeypatch):
    out = tmp_path / "gguf" / "model-abc"
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")

    class Saved:
        def save_pretrained(self, folder, safe_serialization=True):
            (folder / "model.safetensors").write_bytes(b"ours")

    fake = types.SimpleNamespace(AutoTokenizer=types.SimpleNamespace(from_pretrained=lambda *a, **k: object()),
                                 AutoModelForCausalLM=types.SimpleNamespace(from_pretrained=lambda *a, **k: Saved()))

    def other_process_finishes(model, tokenizer, stated):  # while this one converts, the other renames its folder in
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"theirs")
        (out / ".complete").write_text("done\n")

    monkeypatch.setattr(sources, "require", lambda name, purpose="": fake)
    monkeypatch.setattr(sources, "gguf_special_token_ids", lambda path: {})
    monkeypatch.setattr(sources, "fix_config_after_gguf", other_process_finishes)
    monkeypatch.setattr(sources, "save_tokenizer", lambda tokenizer, folder: None)
    sources.convert_gguf(gguf, out)
    assert (out / "model.safetensors").read_bytes() == b"theirs"  # before: deleted and replaced mid-use
    assert sorted(p.name for p in out.parent.iterdir()) == ["model-abc"]  # our temporary folder is gone
