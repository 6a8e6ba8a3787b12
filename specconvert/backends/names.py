"""The model names servers are started under, where more than one module must agree on them."""

from __future__ import annotations


def fixed_chain_model(name: str, draft_len: int) -> str:
    """``<name>-kN``: the server drafting a fixed chain of ``draft_len`` (bench's ``fixed-kN`` arms, tune's
    candidates; ``k0`` serves the target alone)."""
    return f"{name}-k{int(draft_len)}"
