"""Small mixture-of-experts specs that suites in several folders share: SMALL (8 experts top-2 over
ep 4, one stage: the routing-imbalance tests) and FRONTIER (a DeepSeek-V3-like layer: MLA, shared
and fine-grained experts, node-limited routing, tp 2 with SP, pp 2)."""

H, SEQ, K, EP, M, LAYERS = 128, 64, 2, 4, 2, 2
SMALL = dict(arch="llama", layers=LAYERS, hidden=H, ffn_hidden=256, heads=4, kv_heads=4, vocab=512, seq_len=SEQ,
             tied_embeddings=False, experts=8, top_k=K, tp=1, pp=1, dp=EP, ep=EP, order="megatron", num_microbatches=M)
FRONTIER = dict(arch="llama", layers=4, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, seq_len=256,
                tied_embeddings=False, experts=8, top_k=2, moe_ffn_hidden=64, shared_experts=1,
                moe_first_dense_layers=1, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                v_head_dim=32, tp=2, sequence_parallel=True, pp=2, dp=4, ep=4, order="megatron",
                num_microbatches=2, moe_router_num_groups=2, moe_router_group_topk=1)
