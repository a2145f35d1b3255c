"""DeepSeek-V4-Pro's constants the templates, specs and the runner depend on (global widths and
the layer's fixed hyper-parameters, from the model's config as vLLM 0.33's DeepSeek-V4 model code
reads it)."""

HIDDEN = 7168
HEADS = 128
OUTPUT_GROUPS = 16
MOE_INTERMEDIATE = 3072
ROUTED_EXPERTS = 384
EXPERTS_PER_TOKEN = 6
ROUTED_SCALING = 2.5
SWA_WINDOW = 128
CSA_RATIO = 4
HCA_RATIO = 128
CSA_INDEX_TOPK = 1024
HCA_TOPK_ALIGNMENT = 128  # vLLM's _C128A_TOPK_ALIGNMENT
MAX_MODEL_LEN = 1 << 20
MAX_DECODE_TOKENS = 64
Q_LORA = 1536  # q_lora_rank
KV_LORA = 512  # the latent KV width
HEAD_DIM = 512
NOPE = 448  # a head's dims without RoPE
ROPE = 64  # qk_rope_head_dim
STREAMS = 4  # hc_mult: the mHC residual streams
MIXES = (2 + STREAMS) * STREAMS  # 24: the seam's pre, post and comb mixes
SINKHORN_ROUNDS = 20  # hc_sinkhorn_iters
HC_POST_ALPHA = 2.0
EPS = 1e-6  # rms_norm_eps, and the seam's hc_eps
