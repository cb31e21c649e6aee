// Fused differential attention for CPU float32: both softmax maps of a head streamed tile by tile, never
// materialized, forward and backward (see ops/fused_cpu.py for the contract and docs/performance.md for the cost).
//
// Tensors use the paired layout of ops/common.py: q (B, h, T, 2d) = Q1 | Q2, k (B, h_kv, S, 2d) = K1 | K2,
// v (B, h_kv, S, 2d), any strides with the last dimension contiguous. Causal masking is aligned bottom-right
// (query t sits at key position t + S - T). Tile products go to the BLAS that PyTorch links (sgemm_), called
// inside at::parallel_for so it runs single-threaded per tile, as PyTorch's own flash-attention kernel does.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

// Row-major C (m x n) = alpha op(A) op(B) + beta C, as the column-major product C^T = op(B)^T op(A)^T.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  sgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &lb, a, &la, &beta, c, &lc);
}

// exp(x) for the x <= ~0 of a softmax (relative error ~2e-7); below -87 it flushes to ~0. Written branch-free
// so the loops that call it vectorize, and with no infinities anywhere (masked keys are skipped, not -inf).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5 * 2^23 pushes the fraction out
  const float f = t - n;                             // in [-0.5, 0.5]
  float p = 1.535336188319500e-4f;                   // 2^f on [-0.5, 0.5] (Cephes exp2f)
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(float));
  return p * two_n;
}

// Scratch memory on 64-byte boundaries, as PyTorch allocates tensors: BLAS kernels may round differently
// depending on an operand's alignment, and malloc's varies between runs, which would break the bit-exact
// reproducibility a resumed training run relies on.
class Scratch {
 public:
  explicit Scratch(int64_t size)
      : data_(static_cast<float*>(std::aligned_alloc(64, ((size * sizeof(float) + 63) / 64) * 64))) {
    TORCH_CHECK(data_ != nullptr, "out of memory for attention scratch");
  }
  ~Scratch() { std::free(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() { return data_; }
  float& operator[](int64_t i) { return data_[i]; }

 private:
  float* data_;
};

struct Strided {
  float* data;
  int64_t batch, head, row;  // strides of dims 0, 1, 2; dim 3 is contiguous
  float* at(int64_t b, int64_t h, int64_t t) const { return data + b * batch + h * head + t * row; }
};

Strided strided(const torch::Tensor& x) {
  return {x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)};
}

void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  for (const auto* x : {&q, &k, &v}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == torch::kFloat32 && x->dim() == 4,
                "fused CPU differential attention takes 4-D float32 CPU tensors");
    TORCH_CHECK(x->stride(3) == 1, "fused CPU differential attention needs a contiguous last dimension");
  }
}

// Keys a query row may see in the key tile [j0, j0 + cols): all of them, or up to its own position if causal.
inline int visible(bool causal, int64_t query_pos, int64_t j0, int cols) {
  if (!causal) return cols;
  return static_cast<int>(std::clamp<int64_t>(query_pos + 1 - j0, 0, cols));
}

// One online-softmax step for one row of one map: exponentiate the visible logits in place (zero the rest),
// rescale the running sum and accumulator by the change of the running max.
inline void online_softmax_row(float* s, int valid, int cols, float& m, float& l, float* acc, int width) {
  if (valid == 0) {
    std::fill(s, s + cols, 0.0f);
    return;
  }
  float row_max = s[0];
#pragma omp simd reduction(max : row_max)
  for (int j = 1; j < valid; ++j) row_max = std::max(row_max, s[j]);
  const float m_new = std::max(m, row_max);
  const float rescale = exp_nonpositive(m - m_new);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < valid; ++j) {
    s[j] = exp_nonpositive(s[j] - m_new);
    sum += s[j];
  }
  std::fill(s + valid, s + cols, 0.0f);
  l = l * rescale + sum;
  if (rescale != 1.0f)
    for (int c = 0; c < width; ++c) acc[c] *= rescale;
  m = m_new;
}

}  // namespace

// Returns out (B, h, T, 2d) = O1 - lambda O2 (memory ordered (B, T, h, 2d), so merging heads is a view), O2
// (B, h, T, 2d) and the log-sum-exps (2, B, h, T) of both maps, which the backward pass needs.
std::vector<torch::Tensor> diff_attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                  double lambda_full, double scale, bool causal,
                                                  int64_t block_q, int64_t block_k) {
  check_inputs(q, k, v);
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2), d = width / 2, rep = heads / kv_heads;
  const int64_t offset = kv_len - q_len, q_blocks = (q_len + block_q - 1) / block_q;
  auto out = torch::empty({batch, q_len, heads, width}, q.options()).transpose(1, 2);
  auto o2 = torch::empty({batch, heads, q_len, width}, q.options());
  auto lse = torch::empty({2, batch, heads, q_len}, q.options());
  const Strided Q = strided(q), K = strided(k), V = strided(v), O = strided(out), O2 = strided(o2);
  float* lse_data = lse.data_ptr<float>();
  const float lam = static_cast<float>(lambda_full), alpha = static_cast<float>(scale);
  const int64_t lse_map = batch * heads * q_len;

  at::parallel_for(0, batch * heads * q_blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch s1(block_q * block_k), s2(block_q * block_k), acc1(block_q * width), acc2(block_q * width);
    std::vector<float> m1(block_q), m2(block_q), l1(block_q), l2(block_q);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (heads * q_blocks), i = item / q_blocks % heads, t0 = item % q_blocks * block_q;
      const int rows = static_cast<int>(std::min(block_q, q_len - t0));
      const float* qp = Q.at(b, i, t0);
      const float* kp = K.at(b, i / rep, 0);
      const float* vp = V.at(b, i / rep, 0);
      const int64_t key_end = causal ? std::min(kv_len, t0 + rows + offset) : kv_len;
      std::fill(m1.begin(), m1.end(), -1e30f);
      std::fill(m2.begin(), m2.end(), -1e30f);
      std::fill(l1.begin(), l1.end(), 0.0f);
      std::fill(l2.begin(), l2.end(), 0.0f);
      std::fill(acc1.data(), acc1.data() + block_q * width, 0.0f);
      std::fill(acc2.data(), acc2.data() + block_q * width, 0.0f);
      for (int64_t j0 = 0; j0 < key_end; j0 += block_k) {
        const int cols = static_cast<int>(std::min(block_k, key_end - j0));
        gemm(false, true, rows, cols, d, alpha, qp, Q.row, kp + j0 * K.row, K.row, 0.0f, s1.data(), block_k);
        gemm(false, true, rows, cols, d, alpha, qp + d, Q.row, kp + j0 * K.row + d, K.row, 0.0f, s2.data(), block_k);
        for (int r = 0; r < rows; ++r) {
          const int valid = visible(causal, t0 + r + offset, j0, cols);
          online_softmax_row(&s1[r * block_k], valid, cols, m1[r], l1[r], &acc1[r * width], width);
          online_softmax_row(&s2[r * block_k], valid, cols, m2[r], l2[r], &acc2[r * width], width);
        }
        gemm(false, false, rows, width, cols, 1.0f, s1.data(), block_k, vp + j0 * V.row, V.row, 1.0f, acc1.data(), width);
        gemm(false, false, rows, width, cols, 1.0f, s2.data(), block_k, vp + j0 * V.row, V.row, 1.0f, acc2.data(), width);
      }
      for (int r = 0; r < rows; ++r) {
        const float inv1 = 1.0f / l1[r], inv2 = 1.0f / l2[r];
        float* o = O.at(b, i, t0 + r);
        float* o2r = O2.at(b, i, t0 + r);
        for (int64_t c = 0; c < width; ++c) {
          const float a2 = acc2[r * width + c] * inv2;
          o[c] = acc1[r * width + c] * inv1 - lam * a2;
          o2r[c] = a2;
        }
        const int64_t at_row = (b * heads + i) * q_len + t0 + r;
        lse_data[at_row] = m1[r] + std::log(l1[r]);
        lse_data[lse_map + at_row] = m2[r] + std::log(l2[r]);
      }
    }
  });
  return {out, o2, lse};
}

// Gradients of out = (A1 - lambda A2) V given grad_out, the forward's log-sum-exps and delta (2, B, h, T) =
// rowsum(grad_out * O1), rowsum(grad_out * O2). Returns dq (B, h, T, 2d) and per-query-head dk, dv
// (B, h, S, 2d), which the caller sums over the heads of each KV group.
std::vector<torch::Tensor> diff_attention_backward(torch::Tensor grad_out, torch::Tensor q, torch::Tensor k,
                                                   torch::Tensor v, torch::Tensor lse, torch::Tensor delta,
                                                   double lambda_full, double scale, bool causal,
                                                   int64_t block_q, int64_t block_k) {
  check_inputs(q, k, v);
  check_inputs(grad_out, grad_out, grad_out);
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous(), "lse and delta must be contiguous");
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2), d = width / 2, rep = heads / kv_heads;
  const int64_t offset = kv_len - q_len;
  auto dq = torch::zeros({batch, heads, q_len, width}, q.options());
  auto dk = torch::zeros({batch, heads, kv_len, width}, q.options());
  auto dv = torch::zeros({batch, heads, kv_len, width}, q.options());
  const Strided Q = strided(q), K = strided(k), V = strided(v), DO = strided(grad_out);
  const Strided DQ = strided(dq), DK = strided(dk), DV = strided(dv);
  const float* lse_data = lse.data_ptr<float>();
  const float* delta_data = delta.data_ptr<float>();
  const float lam = static_cast<float>(lambda_full), alpha = static_cast<float>(scale);
  const int64_t per_map = batch * heads * q_len;

  // One (batch, head) per task: its dk and dv rows are written by no other task.
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t tile = block_q * block_k;
    Scratch p1(tile), p2(tile), p(tile), dp(tile);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / heads, i = item % heads;
      const float* kp = K.at(b, i / rep, 0);
      const float* vp = V.at(b, i / rep, 0);
      float* dkp = DK.at(b, i, 0);
      float* dvp = DV.at(b, i, 0);
      const float* lse1 = lse_data + item * q_len;
      const float* lse2 = lse1 + per_map;
      const float* delta1 = delta_data + item * q_len;
      const float* delta2 = delta1 + per_map;
      for (int64_t t0 = 0; t0 < q_len; t0 += block_q) {
        const int rows = static_cast<int>(std::min(block_q, q_len - t0));
        const float* qp = Q.at(b, i, t0);
        const float* dop = DO.at(b, i, t0);
        float* dqp = DQ.at(b, i, t0);
        const int64_t key_end = causal ? std::min(kv_len, t0 + rows + offset) : kv_len;
        for (int64_t j0 = 0; j0 < key_end; j0 += block_k) {
          const int cols = static_cast<int>(std::min(block_k, key_end - j0));
          const float* kj = kp + j0 * K.row;
          gemm(false, true, rows, cols, d, alpha, qp, Q.row, kj, K.row, 0.0f, p1.data(), block_k);
          gemm(false, true, rows, cols, d, alpha, qp + d, Q.row, kj + d, K.row, 0.0f, p2.data(), block_k);
          gemm(false, true, rows, cols, width, 1.0f, dop, DO.row, vp + j0 * V.row, V.row, 0.0f, dp.data(), block_k);
          for (int r = 0; r < rows; ++r) {
            const int valid = visible(causal, t0 + r + offset, j0, cols);
            float *a1 = &p1[r * block_k], *a2 = &p2[r * block_k], *a = &p[r * block_k], *g = &dp[r * block_k];
            const float x1 = lse1[t0 + r], x2 = lse2[t0 + r], y1 = delta1[t0 + r], y2 = delta2[t0 + r];
            for (int j = 0; j < valid; ++j) {
              const float e1 = exp_nonpositive(a1[j] - x1), e2 = exp_nonpositive(a2[j] - x2);
              a[j] = e1 - lam * e2;
              a1[j] = e1 * (g[j] - y1);          // dS1 (the scale goes into the products below)
              a2[j] = -lam * e2 * (g[j] - y2);   // dS2
            }
            std::fill(a + valid, a + cols, 0.0f);
            std::fill(a1 + valid, a1 + cols, 0.0f);
            std::fill(a2 + valid, a2 + cols, 0.0f);
          }
          gemm(true, false, cols, width, rows, 1.0f, p.data(), block_k, dop, DO.row, 1.0f, dvp + j0 * DV.row, DV.row);
          gemm(false, false, rows, d, cols, alpha, p1.data(), block_k, kj, K.row, 1.0f, dqp, DQ.row);
          gemm(false, false, rows, d, cols, alpha, p2.data(), block_k, kj + d, K.row, 1.0f, dqp + d, DQ.row);
          gemm(true, false, cols, d, rows, alpha, p1.data(), block_k, qp, Q.row, 1.0f, dkp + j0 * DK.row, DK.row);
          gemm(true, false, cols, d, rows, alpha, p2.data(), block_k, qp + d, Q.row, 1.0f, dkp + j0 * DK.row + d, DK.row);
        }
      }
    }
  });
  return {dq, dk, dv};
}

// Inference for a few queries against a long cache (a decode step): per query, both maps' logits are dot
// products with the cached K1 | K2 rows, and the combined weights A1 - lambda A2 multiply V in ONE pass, so K
// and V are read once and the multiply-adds are the matched baseline's. Plain vectorized loops: for one query
// row, BLAS calls measured slower (their fixed cost and a strided K^T product). Returns (B, h, T, 2d) with heads merged in memory, like the forward above.
// With ``normalize`` each output row then goes through the layer's per-head RMSNorm (gain ``norm_weight`` if
// defined) times ``out_scale``, which saves a one-token step the norm's eight small tensor ops per layer.
torch::Tensor diff_attention_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, double lambda_full,
                                    double scale, bool causal, bool normalize, c10::optional<torch::Tensor> norm_weight,
                                    double norm_eps, double out_scale) {
  check_inputs(q, k, v);
  const float* gain = nullptr;
  if (norm_weight.has_value() && norm_weight->defined()) {
    TORCH_CHECK(norm_weight->scalar_type() == torch::kFloat32 && norm_weight->is_contiguous() &&
                    norm_weight->numel() == q.size(3),
                "norm_weight must be a contiguous float32 vector of q's width");
    gain = norm_weight->data_ptr<float>();
  }
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2), d = width / 2, rep = heads / kv_heads;
  const int64_t offset = kv_len - q_len;
  auto out = torch::empty({batch, q_len, heads, width}, q.options()).transpose(1, 2);
  const Strided Q = strided(q), K = strided(k), V = strided(v), O = strided(out);
  const float lam = static_cast<float>(lambda_full), alpha = static_cast<float>(scale);

  at::parallel_for(0, batch * heads * q_len, 1, [&](int64_t begin, int64_t end) {
    Scratch w1(kv_len), w2(kv_len);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (heads * q_len), i = item / q_len % heads, t = item % q_len;
      const float* q1 = Q.at(b, i, t);
      const float* q2 = q1 + d;
      const int64_t keys = causal ? std::min(kv_len, t + offset + 1) : kv_len;
      const float* kp = K.at(b, i / rep, 0);
      const float* vp = V.at(b, i / rep, 0);
      for (int64_t j = 0; j < keys; ++j) {
        const float* kj = kp + j * K.row;
        float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t c = 0; c < d; ++c) {
          s1 += q1[c] * kj[c];
          s2 += q2[c] * kj[d + c];
        }
        w1[j] = s1 * alpha;
        w2[j] = s2 * alpha;
      }
      float m1 = -1e30f, m2 = -1e30f;
#pragma omp simd reduction(max : m1, m2)
      for (int64_t j = 0; j < keys; ++j) {
        m1 = std::max(m1, w1[j]);
        m2 = std::max(m2, w2[j]);
      }
      float l1 = 0.0f, l2 = 0.0f;
#pragma omp simd reduction(+ : l1, l2)
      for (int64_t j = 0; j < keys; ++j) {
        w1[j] = exp_nonpositive(w1[j] - m1);
        w2[j] = exp_nonpositive(w2[j] - m2);
        l1 += w1[j];
        l2 += w2[j];
      }
      const float c1 = 1.0f / l1, c2 = lam / l2;
      float* o = O.at(b, i, t);
      std::fill(o, o + width, 0.0f);
      for (int64_t j = 0; j < keys; ++j) {
        const float weight = w1[j] * c1 - w2[j] * c2;  // the combined map A1 - lambda A2
        const float* vj = vp + j * V.row;
#pragma omp simd
        for (int64_t c = 0; c < width; ++c) o[c] += weight * vj[c];
      }
      if (normalize) {
        float square_sum = 0.0f;
#pragma omp simd reduction(+ : square_sum)
        for (int64_t c = 0; c < width; ++c) square_sum += o[c] * o[c];
        const float factor = static_cast<float>(out_scale) / std::sqrt(square_sum / width + static_cast<float>(norm_eps));
        for (int64_t c = 0; c < width; ++c) o[c] *= gain ? factor * gain[c] : factor;
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &diff_attention_decode, "differential attention for a few queries, inference (CPU float32)");
  m.def("forward", &diff_attention_forward, "fused differential attention, forward (CPU float32)");
  m.def("backward", &diff_attention_backward, "fused differential attention, backward (CPU float32)");
}
