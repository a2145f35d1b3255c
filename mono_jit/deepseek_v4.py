"""DeepSeek-V4-Pro's constants the templates, specs and the runner depend on (global widths and
the layer's fixed hyper-parameters, from the model's config as vLLM 0.33's DeepSeek-V4 model code
reads it), and a tensor-parallel rank's share of the widths the ranks split."""

from mono_jit.record import Record

HIDDEN = 7168
HEADS = 128
OUTPUT_GROUPS = 16
MOE_INTERMEDIATE = 3072
SHARED_INTERMEDIATE = MOE_INTERMEDIATE  # one shared expert, as wide as a routed one
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


class RankWidths(Record):
    """One rank's share of the widths tensor parallelism splits."""

    heads: int  # attention heads
    groups: int  # output groups of the attention's projection
    group_k: int  # one output group's width: its heads' dims
    inter: int  # a routed expert's intermediate width
    shared_inter: int  # the shared expert's


def per_rank(tp: int) -> RankWidths:
    """What each of `tp` ranks holds; ValueError unless `tp` divides every width it splits
    (spec.VALID_TP lists the tp that do)."""
    widths = {"HEADS": HEADS, "OUTPUT_GROUPS": OUTPUT_GROUPS, "MOE_INTERMEDIATE": MOE_INTERMEDIATE,
              "SHARED_INTERMEDIATE": SHARED_INTERMEDIATE}
    uneven = [f"{name} {width}" for name, width in widths.items() if tp < 1 or width % tp]
    if uneven:
        raise ValueError(f"tensor parallelism {tp} does not split {', '.join(uneven)} evenly: expected a tp "
                         "that divides each")
    heads, groups = HEADS // tp, OUTPUT_GROUPS // tp
    return RankWidths(heads, groups, heads // groups * HEAD_DIM, MOE_INTERMEDIATE // tp, SHARED_INTERMEDIATE // tp)
