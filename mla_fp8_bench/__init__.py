"""mla_fp8_bench: benchmark-and-accuracy suite for FP8 MLA prefill attention.

The path under test is AMD AITER's persistent-scheduled FP8 MLA prefill on gfx950
(``get_ps_metadata_v1`` -> ``mla_prefill_ps_asm_fwd`` -> ``mla_reduce_v1``) as entered by vLLM's
``AiterMLAImpl._mla_fp8_prefill_attn``; on other machines a faithful PyTorch emulation stands in,
and on Hopper FlashAttention-3 FP8 is the peer. Heavy or optional packages are imported lazily.
"""

__version__ = "0.1.0"
