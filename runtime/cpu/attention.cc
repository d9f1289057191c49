// kiln.attention_f32_<isa>: Attention as flash attention. Each block of query rows meets the
// keys a block at a time: scores = Q·Kᵀ for the block (kiln's GEMM on K packed once per KV
// head), then the online softmax (a running maximum and sum per row, the output accumulated so
// far rescaled when the maximum grows), then Y += P·V (the GEMM again, on V packed once). No
// S×T score matrix exists: the workspace is K and V packed plus one block of scores per
// thread, linear in the sequence (with KV heads enough for the threads, each thread packs one
// KV head at a time into its own buffer and runs that head's query blocks while K and V are in
// its cache). The scale is folded into the softmax step; a causal mask
// skips the key blocks wholly after a query block and cuts the one on the diagonal; an
// additive f32 or boolean mask is read where it lies, broadcast over batch, heads and rows;
// grouped-query heads read their KV head's packed K and V, never copies of them. Q, K, V and Y
// are read and written where they lie, head-major ([B, H, S, D]) or sequence-major ([B, S,
// H·D], the projections' own layout, which fuse_attention hands over without transposes).
// With rotary caches (RoPE folded in by fuse_attention), each block of Q rows is rotated into
// the thread's scratch before its products, and K a chunk of keys at a time before packing:
// neither rotated tensor is ever written out. A KV cache (a decoder's step): the past keys and
// values come before the new ones in the packed K and V (the chunks of keys assembled from
// both), the causal limit moves by the past length, and present_key / present_value, when
// asked for, are written as the keys are assembled. Softcap turns each block of scores into
// c·tanh(s·scale / c) on the row kernels before the softmax (which then scales by c), and each
// batch's sequence length (nonpad_kv_seqlen) cuts its keys as the causal limit does, and so does
// a mask shorter than the keys (ONNX pads it with −∞).
//
// kiln.attention_bf16_amx: the same, for an Attention whose products are bf16 (`product_type`,
// set by `kiln compile --precision bf16` on a CPU with AMX): K and V are packed once into AMX's
// bf16 tiles, each query block is rounded to bf16, the two products run on the tiles
// (attention_amx.cc) with f32 sums, the online softmax stays f32 and its probabilities are
// rounded to bf16 for P·V. The output block is summed in the thread's scratch (tiles are whole
// 16-row blocks) and written divided by the softmax's sums.
//
// kiln.qattention_amx: QAttention (compile's lower_int8 on a CPU with AMX: a quantized model's
// attention on its projections' codes) as the AMX kernel's flash attention, every product
// exact or within 2^-16: each row of Q, K and V is taken as its codes less their zero point
// (integers of at most 255 in magnitude, exact in bf16) as it is packed, so Q·Kᵀ sums integer
// products exactly in f32 (heads up to 256 steps), Q's and K's scales joining the softmax's;
// the f32 probabilities each go to P·V as a high and a low bf16 half, two products over V's
// integers; V's scale joins the division by the sums, and a quantized Y is quantized from the
// output block's rows.
//
// kiln.rotary_f32_<isa>: RotaryEmbedding's rotate-half form (what fuse_rotary makes of the
// exporters' x·cos + rotate_half(x)·sin) in one pass over x on the row kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>

#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/gemm_isa.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

// Query rows and keys per block. Up to kWholeKeys keys are one block: no rescaling, and no
// short last block of keys (ViT's 197); longer sequences go kBlockK keys at a time (whole
// tiles of 64 columns), so a block's scores (at most 64 × 512 floats, 128 KiB) stay in L2
// between the two products. Query rows are split into blocks of at most kBlockQ, evenly.
constexpr int64_t kBlockQ = 64, kBlockK = 256, kWholeKeys = 512;
// Keys rotated at a time before packing (rounded to the tile's width).
constexpr int64_t kRotateKeys = 256;

size_t floats_bytes(int64_t n) { return static_cast<size_t>((n * 4 + 63) / 64 * 64); }
int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

std::optional<std::string> flash_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (attention_bf16_products(q)) return "bf16 products (kiln.attention_bf16_amx's)";
  return attention_declines(q);
}

// QAttention's Q, K, V (as if f32) and mask in Attention's places, inputs 0-3: what
// attention_geometry and attention_declines read (the scales and zero points aside).
struct AttentionView {
  explicit AttentionView(const KernelQuery& q) : inputs(as_attention(q)), query{q.node, q.graph, q.target, inputs, q.outputs} {}
  AttentionView(const AttentionView&) = delete;
  AttentionView& operator=(const AttentionView&) = delete;

  std::vector<InferInput> inputs;
  KernelQuery query;

 private:
  static std::vector<InferInput> as_attention(const KernelQuery& q) {
    std::vector<InferInput> in;
    for (size_t i : {0, 3, 6}) in.push_back({DType::f32, q.inputs[i].shape, nullptr});
    in.push_back(q.inputs.size() > 9 ? q.inputs[9] : InferInput{});
    return in;
  }
};

std::optional<std::string> qattention_declines(const KernelQuery& q) {
  if (!q.target.cpu.amx) return "the CPU lacks amx";
  if (auto why = lacks(q.target.cpu, Isa::avx512)) return why;
  for (size_t i : {1, 2, 4, 5, 7, 8, 10, 11})
    if (i < q.inputs.size() && q.inputs[i].dtype != DType::undefined &&
        (!q.inputs[i].shape.is_concrete() || shape_numel(q.inputs[i].shape.concrete()) != 1))
      return "scales or zero points that are not scalars";
  const AttentionView view(q);
  if (auto why = attention_declines(view.query)) return why;
  const AttentionGeometry a = *attention_geometry(view.query);
  if (a.d > amx::kQuantizedHeadMax) return "a head size past 256 (the integer sums of Q·Kᵀ would not be exact in f32)";
  if (a.dv % 16 != 0) return "a value head size that is not a multiple of 16";
  return std::nullopt;
}

std::optional<std::string> amx_declines(const KernelQuery& q) {
  if (!q.target.cpu.amx) return "the CPU lacks amx";
  if (auto why = lacks(q.target.cpu, Isa::avx512)) return why;
  if (!attention_bf16_products(q)) return "f32 products";
  if (auto why = attention_declines(q)) return why;
  if (attention_geometry(q)->dv % 16 != 0) return "a value head size that is not a multiple of 16";
  return std::nullopt;
}

class FlashAttention final : public Kernel {
 public:
  /// `amx`: bf16 products on AMX tiles (the AVX-512 row kernels around them); `quant`: a
  /// QAttention (on AMX tiles).
  FlashAttention(Isa isa, bool amx, bool quant = false) : isa_(isa), amx_(amx), quant_(quant), rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& query, KernelNeeds& needs) override {
    std::optional<AttentionView> view;
    if (quant_) view.emplace(query);
    const KernelQuery& q = quant_ ? view->query : query;  // Attention's inputs 0-3
    const std::optional<AttentionGeometry> a = attention_geometry(q);
    if (!a) return internal_error(q.node.where(), "attention shapes that do not line up");
    if (quant_) {
      for (size_t i = 0; i < 3; ++i) u8_[i] = query.inputs[3 * i].dtype == DType::u8;
      out_q_ = query.outputs[0].dtype != DType::f32;
      out_u8_ = query.outputs[0].dtype == DType::u8;
    }
    p_ = attention_past(q);
    b_ = a->b, hq_ = a->hq, s_ = a->s, d_ = a->d, hkv_ = a->hkv, l_ = a->t, t_ = p_ + a->t, dv_ = a->dv;
    present_k_ = q.outputs.size() > 1 && q.outputs[1].dtype != DType::undefined;
    present_v_ = q.outputs.size() > 2 && q.outputs[2].dtype != DType::undefined;
    qst_ = a->q(), kst_ = a->k(), vst_ = a->v(), yst_ = a->y();
    scale_ = static_cast<float>(q.node.attr_float("scale", 1.0 / std::sqrt(static_cast<double>(d_))));
    causal_ = q.node.attr_int("is_causal", 0) != 0;
    softcap_ = static_cast<float>(q.node.attr_float("softcap", 0.0));
    lengths_ = attention_lengths(q);
    rotary_ = attention_rotary(q);
    // K's chunks assembled in the scratch before packing (QAttention's: its codes less their
    // zero point, as floats).
    assemble_ = rotary_ || p_ > 0 || present_k_ || quant_;
    // The mask's strides over [batch, head, query row], 0 where it broadcasts.
    has_mask_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    bool_mask_ = has_mask_ && q.inputs[3].dtype == DType::boolean;
    if (has_mask_) {
      std::vector<int64_t> md = q.inputs[3].shape.concrete();
      md.insert(md.begin(), 4 - md.size(), 1);
      mask_keys_ = md[3];  // shorter than the keys: those past it are out
      mask_sb_ = md[0] > 1 ? md[1] * md[2] * mask_keys_ : 0;
      mask_sh_ = md[1] > 1 ? md[2] * mask_keys_ : 0;
      mask_si_ = md[2] > 1 ? mask_keys_ : 0;
    }
    // The two products' templates, each on one thread: the threads take whole query blocks.
    const int64_t q_blocks = (s_ + kBlockQ - 1) / kBlockQ;
    bq_ = (s_ + q_blocks - 1) / q_blocks;
    bk_ = t_ <= kWholeKeys ? t_ : kBlockK;
    size_t scratch_bytes = 0;  // the products' own, per thread
    if (amx_) {
      // Whole tiles: query blocks of 16 rows, head steps and key blocks of 32 (zeros past them).
      bq_pad_ = round_up(bq_, 16), dp_ = round_up(d_, 32), ld_ = round_up(bk_, 32);
      const int64_t key_tiles = round_up(t_, 32) / 16;
      k_floats_ = key_tiles * (dp_ / 32) * amx::kTile / 2;  // bf16 pairs counted as floats
      v_floats_ = key_tiles / 2 * (dv_ / 16) * amx::kTile / 2;
      rotate_keys_ = kRotateKeys;
      scratch_bytes = floats_bytes(bq_pad_ * dp_ / 2) + floats_bytes(bq_pad_ * ld_ / 2) + floats_bytes(bq_pad_ * dv_);
      if (quant_) scratch_bytes += floats_bytes(bq_pad_ * ld_ / 2);  // the probabilities' low halves
    } else {
      bq_pad_ = bq_, ld_ = bk_;
      const gemm::CacheSizes& caches = gemm::CacheSizes::host();
      qk_ = gemm::default_params(isa_, gemm::default_tile(isa_, bk_), caches, bq_, bk_, d_, 1);
      pv_ = gemm::default_params(isa_, gemm::default_tile(isa_, dv_), caches, bq_, dv_, bk_, 1);
      k_floats_ = gemm::packed_b_floats(d_, t_, qk_.tile.nr);
      v_floats_ = gemm::packed_b_floats(t_, dv_, pv_.tile.nr);
      const gemm::GemmProblem qk{.m = bq_, .n = bk_, .k = d_, .b_packed = true}, pv{.m = bq_, .n = dv_, .k = bk_, .b_packed = true};
      rotate_keys_ = std::max<int64_t>(qk_.tile.nr, kRotateKeys / qk_.tile.nr * qk_.tile.nr);
      scratch_bytes = floats_bytes(static_cast<int64_t>(std::max(gemm::workspace_bytes(qk_, qk), gemm::workspace_bytes(pv_, pv)) / 4 + 1));
    }
    // Rotated rows: a Q block while the products run, or a chunk of keys while packing
    // (QAttention: a Q block, a chunk of keys or 32 rows of V, each as integers).
    rotated_floats_ = assemble_ ? floats_bytes(std::max({rotary_ || quant_ ? bq_ * d_ : 0, std::min(rotate_keys_, t_) * d_,
                                                         quant_ ? 32 * dv_ : 0})) / 4
                                : 0;
    thread_bytes_ = floats_bytes(bq_pad_ * ld_) + 2 * floats_bytes(bq_pad_) + static_cast<size_t>(rotated_floats_) * 4 + scratch_bytes;
    threads_ = std::max(1, q.target.threads);
    // With KV heads enough to share evenly among the threads, each thread packs a head at a time
    // into its own buffer and runs that head's query blocks while K and V are in its cache (packed
    // all at once, they are written to memory between the model's larger products and read back).
    const int64_t kv_heads = b_ * hkv_;
    per_head_ = kv_heads % threads_ == 0 || kv_heads >= 4 * threads_;
    packed_bytes_ = floats_bytes((per_head_ ? threads_ : kv_heads) * (k_floats_ + v_floats_));
    needs.workspace_bytes = packed_bytes_ + thread_bytes_ * static_cast<size_t>(threads_);
    return {};
  }

  Status run(KernelContext& ctx) override {
    // QAttention: Q, K and V are codes (inputs 0, 3, 6, each with its scale and zero point);
    // its products run on the codes less their zero points, and the scales are applied after.
    const size_t mask_input = quant_ ? 9 : 3;
    const float* qd = quant_ ? nullptr : ctx.input(0).data<float>();
    const float* kd = quant_ ? nullptr : ctx.input(1).data<float>();
    const float* vd = quant_ ? nullptr : ctx.input(2).data<float>();
    Codes codes[3];
    float y_scale = 1;
    int32_t y_zero = 0;
    if (quant_) {
      for (size_t i = 0; i < 3; ++i)
        codes[i] = {static_cast<const uint8_t*>(ctx.input(3 * i).raw()), ctx.input(3 * i + 1).data<float>()[0],
                    static_cast<int32_t>(ctx.input(3 * i + 2).as_int64(0)), u8_[i]};
      if (out_q_) y_scale = ctx.input(10).data<float>()[0], y_zero = static_cast<int32_t>(ctx.input(11).as_int64(0));
    }
    const float* mask = has_mask_ && !bool_mask_ ? ctx.input(mask_input).data<float>() : nullptr;
    const bool* keep = bool_mask_ ? ctx.input(mask_input).data<bool>() : nullptr;
    const float* past_k = p_ ? ctx.input(4).data<float>() : nullptr;
    const float* past_v = p_ ? ctx.input(5).data<float>() : nullptr;
    float* present_k = present_k_ ? ctx.output(1).data<float>() : nullptr;
    float* present_v = present_v_ ? ctx.output(2).data<float>() : nullptr;
    const float* cos = rotary_ ? ctx.input(7).data<float>() : nullptr;
    const float* sin = rotary_ ? ctx.input(8).data<float>() : nullptr;
    const int64_t* lengths = lengths_ ? ctx.input(6).data<int64_t>() : nullptr;
    const int64_t half = d_ / 2;
    // Softcap: scores become c·tanh(s·scale / c) before the mask; the softmax then scales by c.
    const float softmax_scale = softcap_ > 0 ? softcap_ : quant_ ? scale_ * codes[0].scale * codes[1].scale : scale_;
    const float capped = softcap_ > 0 ? scale_ / softcap_ : 0.f;
    const float y_factor = quant_ ? codes[2].scale : 1.f;  // V's scale, applied with the division by the sums
    const ActivationSpec tanh_spec{Activation::tanh};
    // AMX: elements between B's tiles of successive key groups (Kᵀ) and successive key chunks (V).
    const int64_t key_group_tiles = (dp_ / 32) * amx::kTile, value_chunk_tiles = (dv_ / 16) * amx::kTile;
    float* y = out_q_ ? nullptr : ctx.output(0).data<float>();
    uint8_t* y_codes = out_q_ ? static_cast<uint8_t*>(ctx.output(0).raw()) : nullptr;
    std::byte* ws = ctx.workspace().data();
    float* packed = reinterpret_cast<float*>(ws);
    const int64_t heads = b_ * hkv_, rep = hq_ / hkv_, q_blocks = (s_ + bq_ - 1) / bq_;
    const int64_t items = b_ * hq_ * q_blocks;
    const int threads = static_cast<int>(std::min<int64_t>({threads_, pool_threads(), std::max(heads, items)}));
    auto body = [&](int thread) {
      if (amx_) amx::configure();
      std::byte* mine = ws + packed_bytes_ + thread_bytes_ * static_cast<size_t>(thread);
      float* scores = reinterpret_cast<float*>(mine);
      float* m = scores + floats_bytes(bq_pad_ * ld_) / 4;
      float* l = m + floats_bytes(bq_pad_) / 4;
      float* rotated = l + floats_bytes(bq_pad_) / 4;
      std::byte* gemm_ws = reinterpret_cast<std::byte*>(rotated + rotated_floats_);
      // AMX: the query block and the probabilities in bf16, the output block summed in f32.
      uint16_t* q_bf16 = amx_ ? reinterpret_cast<uint16_t*>(gemm_ws) : nullptr;
      uint16_t* p_bf16 = amx_ ? q_bf16 + floats_bytes(bq_pad_ * dp_ / 2) / 2 : nullptr;
      float* o_block = amx_ ? reinterpret_cast<float*>(p_bf16 + floats_bytes(bq_pad_ * ld_ / 2) / 2) : nullptr;
      uint16_t* p_low = quant_ ? reinterpret_cast<uint16_t*>(o_block + floats_bytes(bq_pad_ * dv_) / 4) : nullptr;
      // K (as Kᵀ) and V of each KV head, packed once. K's chunks of keys are assembled first
      // where there is more to do than packing: the past keys, then the new ones (rotated), each
      // chunk copied to present_key when it is asked for.
      auto pack = [&](int64_t h, float* pk) {
        if (quant_) {
          pack_codes(codes, h, rotated, pk);
          return;
        }
        const float* k = kd + kst_.at(h / hkv_, h % hkv_);
        if (!assemble_) {
          pack_keys(k, kst_.row, 0, t_, pk);
        } else {
          const int64_t rows = (h / hkv_) * s_;  // the batch's first cache row (the new keys are the queries' tokens)
          for (int64_t j0 = 0; j0 < t_; j0 += rotate_keys_) {
            const int64_t n = std::min(rotate_keys_, t_ - j0), past = std::clamp<int64_t>(p_ - j0, 0, n), fresh = n - past;
            if (past) std::memcpy(rotated, past_k + (h * p_ + j0) * d_, static_cast<size_t>(past * d_) * sizeof(float));
            if (fresh) {
              const int64_t j = j0 + past - p_;  // the first new key of the chunk
              float* to = rotated + past * d_;
              if (rotary_) {
                rows_.rotate_rows(k + j * kst_.row, kst_.row, to, d_, cos + (rows + j) * half, sin + (rows + j) * half, fresh, d_, half);
              } else {
                for (int64_t r = 0; r < fresh; ++r)
                  std::memcpy(to + r * d_, k + (j + r) * kst_.row, static_cast<size_t>(d_) * sizeof(float));
              }
            }
            pack_keys(rotated, d_, j0, n, pk);
            if (present_k) std::memcpy(present_k + (h * t_ + j0) * d_, rotated, static_cast<size_t>(n * d_) * sizeof(float));
          }
        }
        if (amx_) {
          for (int64_t j = round_up(t_, 16); j < round_up(t_, 32); j += 16)  // zeros up to whole chunks of 32 keys
            amx::pack_key_group(nullptr, 0, 0, d_, key_tiles(pk, j));
        }
        const float* v = vd + vst_.at(h / hkv_, h % hkv_);
        if (amx_) {
          const float* rows[32];
          for (int64_t j0 = 0; j0 < t_; j0 += 32) {
            const int64_t n = std::min<int64_t>(32, t_ - j0);
            for (int64_t r = 0; r < n; ++r) {
              const int64_t key = j0 + r;
              rows[r] = key < p_ ? past_v + (h * p_ + key) * dv_ : v + (key - p_) * vst_.row;
            }
            amx::pack_value_rows(rows, n, dv_, value_tiles(pk, j0));
          }
        } else if (!p_) {
          gemm::pack_b(v, vst_.row, false, t_, dv_, pv_.tile.nr, pk + k_floats_);
        } else {  // past rows, then the new ones, into the same panels
          gemm::pack_b_panels(past_v + h * p_ * dv_, dv_, false, 0, p_, 0, dv_, pv_.tile.nr, pk + k_floats_, t_ * pv_.tile.nr);
          gemm::pack_b_panels(v, vst_.row, false, 0, l_, 0, dv_, pv_.tile.nr, pk + k_floats_ + p_ * pv_.tile.nr, t_ * pv_.tile.nr);
        }
        if (present_v) {
          float* to = present_v + h * t_ * dv_;
          if (p_) std::memcpy(to, past_v + h * p_ * dv_, static_cast<size_t>(p_ * dv_) * sizeof(float));
          for (int64_t r = 0; r < l_; ++r) std::memcpy(to + (p_ + r) * dv_, v + r * vst_.row, static_cast<size_t>(dv_) * sizeof(float));
        }
      };
      // One block of query rows of one head (item = (batch · heads + head) · blocks + block),
      // against its KV head's packed K and V at pk.
      auto attend = [&](int64_t item, float* pk) {
        const int64_t qb = item % q_blocks, bh = item / q_blocks, b = bh / hq_, h = bh % hq_;
        const int64_t q0 = qb * bq_, rows = std::min(bq_, s_ - q0), rows_pad = amx_ ? round_up(rows, 16) : rows;
        const int64_t ldy = yst_.row, y_at = yst_.at(b, h) + q0 * ldy;
        float* out = out_q_ ? nullptr : y + y_at;
        // The output block: Y's rows in place, or the AMX tiles' f32 block, dv_ apart.
        float* acc = amx_ ? o_block : out;
        const int64_t ldo = amx_ ? dv_ : ldy;
        int64_t keys = causal_ ? std::min(t_, q0 + rows + p_) : t_;  // keys after the block's last row are out
        if (lengths) keys = std::clamp<int64_t>(lengths[b], 0, keys);  // the batch's keys past its length are out
        if (has_mask_) keys = std::min(keys, mask_keys_);
        // The first block's P·V writes the output rather than adding to it (the softmax leaves
        // rows with nothing before them alone); f32: a single block's probabilities come divided
        // by their sums, so that P·V is the output itself.
        const bool only = !amx_ && keys > 0 && keys <= bk_;
        if (keys <= 0)
          for (int64_t i = 0; i < rows_pad; ++i) std::fill(acc + i * ldo, acc + i * ldo + dv_, 0.f);
        std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
        std::fill(l, l + rows, 0.f);
        const float* qa = quant_ ? nullptr : qd + qst_.at(b, h) + q0 * qst_.row;
        int64_t lda = qst_.row;
        if (quant_) {
          const Codes& c = codes[0];
          const uint8_t* from = c.data + qst_.at(b, h) + q0 * qst_.row;
          for (int64_t i = 0; i < rows; ++i) rows_.dequantize(from + i * qst_.row, rotated + i * d_, d_, 1.f, c.zero, c.u8);
          qa = rotated, lda = d_;
        } else if (rotary_) {
          const int64_t row0 = b * s_ + q0;
          rows_.rotate_rows(qa, lda, rotated, d_, cos + row0 * half, sin + row0 * half, rows, d_, half);
          qa = rotated, lda = d_;
        }
        if (amx_) {
          amx::to_bf16_rows(qa, lda, rows, d_, q_bf16, dp_, dp_, rows_pad);
          std::fill(p_bf16 + rows * ld_, p_bf16 + rows_pad * ld_, uint16_t{0});  // the probabilities' padding rows
          if (quant_) std::fill(p_low + rows * ld_, p_low + rows_pad * ld_, uint16_t{0});
        }
        for (int64_t k0 = 0; k0 < keys; k0 += bk_) {
          const int64_t n = std::min(bk_, keys - k0);
          if (amx_) {
            amx::product(q_bf16, dp_, rows_pad, dp_ / 32, key_tiles(pk, k0), key_group_tiles, amx::kTile, round_up(n, 32) / 16, scores,
                         ld_, false);
          } else {
            gemm::GemmProblem qk{.m = rows, .n = n, .k = d_, .a = qa, .lda = lda,
                                 .b = pk + (k0 / qk_.tile.nr) * d_ * qk_.tile.nr, .b_packed = true, .c = scores, .ldc = ld_};
            gemm::run(qk_, qk, gemm_ws);
          }
          if (softcap_ > 0)
            for (int64_t i = 0; i < rows; ++i) {
              float* row = scores + i * ld_;
              rows_.binary(BinaryOp::mul, row, 1, 0, &capped, 0, 0, row, 1, n);
              rows_.activation(row, row, n, tanh_spec);
            }
          const int64_t mo = b * mask_sb_ + h * mask_sh_ + q0 * mask_si_ + k0;
          const float* mask_at = mask ? mask + mo : nullptr;
          const bool* keep_at = keep ? keep + mo : nullptr;
          const int64_t causal_at = causal_ ? q0 + p_ - k0 : kNoCausal;
          if (quant_) {
            // The probabilities in f32, then each as a high and a low bf16 half: P·V in two
            // products carries them to 16 bits (V's integers are exact in bf16).
            rows_.softmax_block(scores, ld_, rows, n, softmax_scale, mask_at, keep_at, mask_si_, causal_at, m, l, acc, ldo, dv_, false);
            const int64_t chunks = round_up(n, 32) / 32;
            amx::split_bf16_rows(scores, ld_, rows, n, p_bf16, p_low, ld_, chunks * 32);
            amx::product(p_bf16, ld_, rows_pad, chunks, value_tiles(pk, k0), amx::kTile, value_chunk_tiles, dv_ / 16, acc, ldo, k0 > 0);
            amx::product(p_low, ld_, rows_pad, chunks, value_tiles(pk, k0), amx::kTile, value_chunk_tiles, dv_ / 16, acc, ldo, true);
          } else if (amx_) {
            rows_.softmax_block_bf16(scores, ld_, rows, n, softmax_scale, mask_at, keep_at, mask_si_, causal_at, m, l, acc, ldo, dv_, p_bf16, ld_);
            const int64_t chunks = round_up(n, 32) / 32;
            amx::product(p_bf16, ld_, rows_pad, chunks, value_tiles(pk, k0), amx::kTile, value_chunk_tiles, dv_ / 16, acc, ldo, k0 > 0);
          } else {
            rows_.softmax_block(scores, ld_, rows, n, softmax_scale, mask_at, keep_at, mask_si_, causal_at, m, l, acc, ldo, dv_, only);
            gemm::GemmProblem pv{.m = rows, .n = dv_, .k = n, .a = scores, .lda = ld_, .b = pk + k_floats_ + k0 * pv_.tile.nr,
                                 .b_packed = true, .b_panel_stride = t_ * pv_.tile.nr, .c = out, .ldc = ldy, .accumulate = k0 > 0};
            gemm::run(pv_, pv, gemm_ws);
          }
        }
        if (only) return;
        for (int64_t i = 0; i < rows; ++i) {  // a row with nothing to attend to: 0 · (1 / 0), NaN
          const float inv = y_factor / l[i];
          if (out_q_) {  // quantized from the block's row
            float* row = acc + i * ldo;
            rows_.binary(BinaryOp::mul, row, 1, 0, &inv, 0, 0, row, 1, dv_);
            rows_.quantize(row, y_codes + y_at + i * ldy, dv_, y_scale, y_zero, out_u8_);
          } else {
            rows_.binary(BinaryOp::mul, acc + i * ldo, 1, 0, &inv, 0, 0, out + i * ldy, 1, dv_);
          }
        }
      };
      if (per_head_) {  // each KV head packed into the thread's own buffer, then its query blocks
        float* pk = packed + thread * (k_floats_ + v_floats_);
#pragma omp for schedule(dynamic)
        for (int64_t kv = 0; kv < heads; ++kv) {
          pack(kv, pk);
          const int64_t b = kv / hkv_, first = (b * hq_ + kv % hkv_ * rep) * q_blocks;
          for (int64_t item = first; item < first + rep * q_blocks; ++item) attend(item, pk);
        }
      } else {  // every KV head packed once, then the query blocks shared
#pragma omp for schedule(static)
        for (int64_t h = 0; h < heads; ++h) pack(h, packed + h * (k_floats_ + v_floats_));
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < items; ++item) {
          const int64_t bh = item / q_blocks;
          attend(item, packed + (bh / hq_ * hkv_ + bh % hq_ / rep) * (k_floats_ + v_floats_));
        }
      }
      if (amx_) amx::release();
    };
    if (threads <= 1) {
      body(0);
    } else {
#pragma omp parallel num_threads(threads)
      {
        WorkerSpan span;
        body(omp_get_thread_num());
      }
    }
    return {};
  }

 private:
  // QAttention's codes of Q, K or V (1 byte each; u8, else s8), their scale and zero point.
  struct Codes {
    const uint8_t* data = nullptr;
    float scale = 1;
    int32_t zero = 0;
    bool u8 = true;
  };

  // QAttention: KV head h's keys and values (codes[1], codes[2]) into its packed K and V, each
  // row first as its codes less the zero point (floats) in `rows`.
  void pack_codes(const Codes (&codes)[3], int64_t h, float* rows, float* pk) const {
    const Codes &k = codes[1], &v = codes[2];
    const uint8_t* kc = k.data + kst_.at(h / hkv_, h % hkv_);
    for (int64_t j0 = 0; j0 < t_; j0 += rotate_keys_) {
      const int64_t n = std::min(rotate_keys_, t_ - j0);
      for (int64_t r = 0; r < n; ++r) rows_.dequantize(kc + (j0 + r) * kst_.row, rows + r * d_, d_, 1.f, k.zero, k.u8);
      pack_keys(rows, d_, j0, n, pk);
    }
    for (int64_t j = round_up(t_, 16); j < round_up(t_, 32); j += 16) amx::pack_key_group(nullptr, 0, 0, d_, key_tiles(pk, j));
    const uint8_t* vc = v.data + vst_.at(h / hkv_, h % hkv_);
    const float* row_at[32];
    for (int64_t j0 = 0; j0 < t_; j0 += 32) {
      const int64_t n = std::min<int64_t>(32, t_ - j0);
      for (int64_t r = 0; r < n; ++r) {
        rows_.dequantize(vc + (j0 + r) * vst_.row, rows + r * dv_, dv_, 1.f, v.zero, v.u8);
        row_at[r] = rows + r * dv_;
      }
      amx::pack_value_rows(row_at, n, dv_, value_tiles(pk, j0));
    }
  }

  // n keys from `k` (rows `ldk` apart), keys [j0, j0 + n) of the head, into its packed Kᵀ
  // (`pk`): the GEMM's panels, or AMX's tiles a group of 16 keys at a time.
  void pack_keys(const float* k, int64_t ldk, int64_t j0, int64_t n, float* pk) const {
    if (!amx_) {  // Kᵀ's panels of nr keys, d_ rows each (zeros past the last key)
      const int64_t nr = qk_.tile.nr;
      float* panels = pk + j0 / nr * d_ * nr;
      for (int64_t j = 0; j < n; j += nr) {
        const int64_t w = std::min(nr, n - j);
        float* panel = panels + j / nr * d_ * nr;
        rows_.transpose(k + j * ldk, ldk, w, d_, panel, nr);
        if (w < nr)
          for (int64_t p = 0; p < d_; ++p) std::fill(panel + p * nr + w, panel + (p + 1) * nr, 0.f);
      }
      return;
    }
    for (int64_t j = 0; j < n; j += 16) amx::pack_key_group(k + j * ldk, ldk, std::min<int64_t>(16, n - j), d_, key_tiles(pk, j0 + j));
  }
  // AMX: the tiles of the group of 16 keys from `key` on (a multiple of 16), and of V's chunk of
  // 32 keys from `key` on (a multiple of 32), in a head's packed K and V.
  uint16_t* key_tiles(float* pk, int64_t key) const { return reinterpret_cast<uint16_t*>(pk) + key / 16 * (dp_ / 32) * amx::kTile; }
  uint16_t* value_tiles(float* pk, int64_t key) const {
    return reinterpret_cast<uint16_t*>(pk + k_floats_) + key / 32 * (dv_ / 16) * amx::kTile;
  }

  Isa isa_;
  bool amx_ = false, quant_ = false;
  bool u8_[3] = {true, true, true}, out_q_ = false, out_u8_ = false;  // QAttention's Q, K, V and Y types
  const RowKernels& rows_;
  int64_t b_ = 0, hq_ = 0, s_ = 0, d_ = 0, hkv_ = 0, t_ = 0, dv_ = 0, bq_ = 0, bk_ = 0;
  int64_t bq_pad_ = 0, ld_ = 0, dp_ = 0;  // query rows, scores' row length, head steps (AMX: whole tiles)
  int64_t p_ = 0, l_ = 0;  // past and new keys (t_ = p_ + l_)
  bool present_k_ = false, present_v_ = false, assemble_ = false;
  HeadStrides qst_, kst_, vst_, yst_;
  float scale_ = 1, softcap_ = 0;
  bool lengths_ = false;  // nonpad_kv_seqlen: each batch's keys
  bool causal_ = false, has_mask_ = false, bool_mask_ = false, rotary_ = false;
  int64_t rotate_keys_ = 0, rotated_floats_ = 0;
  int64_t mask_keys_ = 0, mask_sb_ = 0, mask_sh_ = 0, mask_si_ = 0;
  gemm::GemmParams qk_, pv_;
  int64_t k_floats_ = 0, v_floats_ = 0;
  size_t packed_bytes_ = 0, thread_bytes_ = 0;
  int threads_ = 1;
  bool per_head_ = false;  // K and V packed a head at a time per thread (else all at once, shared)
};

// The rotary embedding's sizes, for 3-D or 4-D x with concrete shapes.
struct RotaryShape {
  int64_t batch = 0, seq = 0, heads = 0, d = 0, half = 0;
  bool seq_major = false;
};

std::optional<RotaryShape> rotary_shape(const KernelQuery& q) {
  const Shape& xs = q.inputs[0].shape;
  if (!xs.is_concrete() || (xs.rank() != 3 && xs.rank() != 4)) return std::nullopt;
  const std::vector<int64_t> x = xs.concrete();
  RotaryShape r{.batch = x[0], .seq = x[xs.rank() == 4 ? 2 : 1], .seq_major = xs.rank() == 3};
  r.heads = r.seq_major ? q.node.attr_int("num_heads", 0) : x[1];
  if (r.heads <= 0 || (r.seq_major && x[2] % r.heads != 0)) return std::nullopt;
  r.d = r.seq_major ? x[2] / r.heads : x[3];
  const int64_t rot = q.node.attr_int("rotary_embedding_dim", 0);
  r.half = (rot > 0 ? rot : r.d) / 2;
  return r;
}

std::optional<std::string> rotary_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  for (size_t i = 0; i < 3; ++i)
    if (q.inputs[i].dtype != DType::f32) return "not f32";
  if (q.node.attr_int("interleaved", 0) != 0) return "interleaved pairs";
  const std::optional<RotaryShape> r = rotary_shape(q);
  if (!r) return "the input's shape is not known ahead";
  const bool positions = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
  if (q.inputs[1].shape != q.inputs[2].shape) return "caches of different shapes";
  for (size_t i : {1, 2}) {
    if (!q.inputs[i].shape.is_concrete()) return "caches of unknown shape";
    const std::vector<int64_t> c = q.inputs[i].shape.concrete();
    const bool fits = positions ? c.size() == 2 && c[1] == r->half : c == std::vector<int64_t>{r->batch, r->seq, r->half};
    if (!fits) return "caches that do not match the input";
  }
  if (positions && q.inputs[3].shape.concrete() != std::vector<int64_t>{r->batch, r->seq}) return "position ids that do not match the input";
  return std::nullopt;
}

class RotaryKernel final : public Kernel {
 public:
  explicit RotaryKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    shape_ = *rotary_shape(q);
    positions_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    if (positions_) max_pos_ = q.inputs[1].shape.concrete()[0];
    return {};
  }
  Status run(KernelContext& ctx) override {
    const int64_t* rows = nullptr;
    if (positions_) {  // data: checked on every run, as the reference does
      rows = ctx.input(3).data<int64_t>();
      for (int64_t i = 0; i < shape_.batch * shape_.seq; ++i)
        if (rows[i] < 0 || rows[i] >= max_pos_)
          return ctx.error("position id " + std::to_string(rows[i]) + " is out of range for a cache of " + std::to_string(max_pos_) +
                           " positions");
    }
    rows_.rotary(ctx.input(0).data<float>(), ctx.output(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(), rows,
                 shape_.batch, shape_.seq, shape_.heads, shape_.d, shape_.half, shape_.seq_major);
    return {};
  }

 private:
  const RowKernels& rows_;
  RotaryShape shape_;
  bool positions_ = false;
  int64_t max_pos_ = 0;
};

}  // namespace

void register_attention(KernelRegistry& r) {
  r.add("QAttention", "cpu",
        KernelImpl{.name = "kiln.qattention_amx",
                   .declines = qattention_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<FlashAttention>(Isa::avx512, true, true); },
                   .needs_isa = *CpuFeatures::named("amx")});
  r.add("Attention", "cpu",
        KernelImpl{.name = "kiln.attention_bf16_amx",
                   .declines = amx_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<FlashAttention>(Isa::avx512, true); },
                   .needs_isa = *CpuFeatures::named("amx")});
  for (Isa isa : {Isa::avx512, Isa::avx2}) {
    r.add("Attention", "cpu",
          KernelImpl{.name = std::string("kiln.attention_f32_") + isa_name(isa),
                     .declines = [isa](const KernelQuery& q) { return flash_declines(q, isa); },
                     .create = [isa](const KernelQuery&) { return std::make_unique<FlashAttention>(isa, false); },
                     .needs_isa = isa_features(isa)});
    r.add("RotaryEmbedding", "cpu",
          KernelImpl{.name = std::string("kiln.rotary_f32_") + isa_name(isa),
                     .declines = [isa](const KernelQuery& q) { return rotary_declines(q, isa); },
                     .create = [isa](const KernelQuery&) { return std::make_unique<RotaryKernel>(isa); },
                     .needs_isa = isa_features(isa)});
  }
}

}  // namespace kiln::cpu
