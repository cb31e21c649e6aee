// Fused differential attention for CPU float32, forward and backward (see ops/fused_cpu.py for the contract and
// docs/performance.md for the cost). A task takes a block of query rows of one head and forms both maps'
// logits for every key those rows see in per-thread scratch memory of bounded size (never the whole (T, S)
// map; ops/fused_cpu.py chooses the rows): each row's softmax is then exact, the maps combine into
// A1 - lambda A2 before V is touched, and one product with V makes the output, so the multiply-adds are the
// matched baseline's.
//
// Tensors use the paired layout of ops/common.py: q (B, h, T, 2d) = Q1 | Q2, k (B, h_kv, S, 2d) = K1 | K2,
// v (B, h_kv, S, 2d), any strides with the last dimension contiguous. Causal masking is aligned bottom-right
// (query t sits at key position t + S - T). Products go to the BLAS that PyTorch links (sgemm_), called
// inside at::parallel_for so it runs single-threaded per task, as PyTorch's own flash-attention kernel does.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <array>
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

// The paired layout's rules (ops/common.py, check_diff_inputs), raised as Python ValueErrors with its messages,
// so the decode step can call the kernel without the Python check (a measurable share of a one-token step).
void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  for (const auto* x : {&q, &k, &v}) {
    TORCH_CHECK_VALUE(x->device().is_cpu() && x->scalar_type() == torch::kFloat32 && x->dim() == 4,
                      "the C++ differential-attention kernels take 4-D float32 CPU tensors (batch, heads, seq, 2d);"
                      " got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), " of ", x->scalar_type(), " on ",
                      x->device());
    TORCH_CHECK_VALUE(x->stride(3) == 1, "the C++ differential-attention kernels need a contiguous last dimension");
  }
  const int64_t batch = q.size(0), heads = q.size(1), width = q.size(3), kv_heads = k.size(1);
  TORCH_CHECK_VALUE(width % 2 == 0, "q's last dim must be 2d (an even number); got ", width);
  TORCH_CHECK_VALUE(k.size(0) == batch && v.size(0) == batch, "batch sizes differ: q ", batch, ", k ", k.size(0),
                    ", v ", v.size(0));
  TORCH_CHECK_VALUE(k.size(3) == width, "k must be (batch, h_kv, kv_len, 2d=", width, "); got ", k.sizes());
  TORCH_CHECK_VALUE(v.size(1) == kv_heads && v.size(2) == k.size(2) && v.size(3) == width, "v must be (batch, ",
                    kv_heads, ", ", k.size(2), ", ", width, ") like k; got ", v.sizes());
  TORCH_CHECK_VALUE(kv_heads > 0 && heads % kv_heads == 0, "differential heads (", heads,
                    ") must be a multiple of KV heads (", kv_heads, ")");
  TORCH_CHECK_VALUE(q.size(2) <= k.size(2), "query length (", q.size(2), ") cannot exceed key length (", k.size(2),
                    ")");
}

// ``x`` with a contiguous last dimension (a copy only where it is strided).
torch::Tensor last_dim_contiguous(const torch::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

// Keys query row ``query_pos`` sees among the first ``keys``: all of them, or up to its own position if causal.
inline int64_t visible(bool causal, int64_t query_pos, int64_t keys) {
  return causal ? std::clamp<int64_t>(query_pos + 1, 0, keys) : keys;
}

// Leading dimension of a scratch row of ``keys`` floats: a multiple of 16 keeps every row 64-byte aligned.
inline int64_t padded(int64_t keys) { return (keys + 15) / 16 * 16; }

// Largest of n floats. Sixteen running maxima, because GCC leaves a max reduction scalar (one vmaxss per element,
// each waiting for the last) even under `omp simd`, which made it the forward's costliest loop.
inline float row_max(const float* s, int64_t n) {
  constexpr int lanes = 16;
  float m[lanes];
  std::fill(m, m + lanes, -1e30f);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (int c = 0; c < lanes; ++c) m[c] = std::max(m[c], s[j + c]);
  for (int c = 0; j < n; ++j, ++c) m[c] = std::max(m[c], s[j]);
  return *std::max_element(m, m + lanes);
}

// Softmax of one row's ``valid`` logits in place, returning the log-sum-exp (0 for a row that sees no key).
inline float softmax_row(float* s, int64_t valid) {
  if (valid == 0) return 0.0f;
  const float m = row_max(s, valid);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < valid; ++j) {
    s[j] = exp_nonpositive(s[j] - m);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < valid; ++j) s[j] *= inv;
  return m + std::log(sum);
}

// One query row's two maps from their logits over the ``valid`` keys it sees: each softmax taken in place, then
// a1 = A1 - lambda A2, the weights that multiply V. Writes both maps' log-sum-exps.
inline void combined_row(float* a1, float* a2, int64_t valid, float lam, float& lse1, float& lse2) {
  lse1 = softmax_row(a1, valid);
  lse2 = softmax_row(a2, valid);
#pragma omp simd
  for (int64_t j = 0; j < valid; ++j) a1[j] -= lam * a2[j];
}

// Dot product of n floats in 16 running sums summed as a tree: a fixed-width loop the compiler keeps in vector
// registers. (An `omp simd` reduction over two products at once compiled to scalar adds through the stack.)
inline float dot(const float* a, const float* b, int64_t n) {
  constexpr int lanes = 16;
  float acc[lanes] = {};
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes)
    for (int u = 0; u < lanes; ++u) acc[u] += a[c + u] * b[c + u];
  for (int u = 0; c < n; ++c, ++u) acc[u] += a[c] * b[c];
  for (int u = 0; u < 8; ++u) acc[u] += acc[u + 8];
  for (int u = 0; u < 4; ++u) acc[u] += acc[u + 4];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// o[0:width) = sum over j < keys of w[j] * v[j * row : j * row + width), a block of 64 outputs at a time held in
// registers across all keys (accumulating into o itself spent the loop on loads and stores of o).
inline void weighted_rows(const float* w, const float* v, int64_t row, int64_t keys, int64_t width, float* o) {
  constexpr int block = 64;
  int64_t c0 = 0;
  for (; c0 + block <= width; c0 += block) {
    float acc[block] = {};
    for (int64_t j = 0; j < keys; ++j) {
      const float wj = w[j];
      const float* vj = v + j * row + c0;
      for (int u = 0; u < block; ++u) acc[u] += wj * vj[u];
    }
    std::copy(acc, acc + block, o + c0);
  }
  if (c0 < width) {
    std::fill(o + c0, o + width, 0.0f);
    for (int64_t j = 0; j < keys; ++j)
      for (int64_t c = c0; c < width; ++c) o[c] += w[j] * v[j * row + c];
  }
}

// The rotary embedding of one query row in the paired layout: each d-wide half (Q1, then Q2) rotated by the
// angles of its position, cos[j * cos_step] and sin[j * sin_step] for j < d/2, pairing dims (2j, 2j+1)
// ("interleaved") or (j, j + d/2) ("half"), as ops/rotary.py's apply_rotary does.
inline void rotate_query(const float* q, int64_t d, const float* cos, int64_t cos_step, const float* sin,
                         int64_t sin_step, bool half, float* out) {
  const int64_t pairs = d / 2;
  for (int64_t offset = 0; offset < 2 * d; offset += d) {
    const float* x = q + offset;
    float* y = out + offset;
    for (int64_t j = 0; j < pairs; ++j) {
      const float c = cos[j * cos_step], s = sin[j * sin_step];
      const int64_t i0 = half ? j : 2 * j, i1 = half ? j + pairs : 2 * j + 1;
      const float x0 = x[i0], x1 = x[i1];
      y[i0] = x0 * c - x1 * s;
      y[i1] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

// Returns out (B, h, T, 2d) = (A1 - lambda A2) V (memory ordered (B, T, h, 2d), so merging heads is a view) and
// the log-sum-exps (2, B, h, T) of both maps, which the backward pass needs. ``block_q`` query rows per task.
std::vector<torch::Tensor> diff_attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                  double lambda_full, double scale, bool causal, int64_t block_q) {
  check_inputs(q, k, v);
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2), d = width / 2, rep = heads / kv_heads;
  const int64_t offset = kv_len - q_len, q_blocks = (q_len + block_q - 1) / block_q, ld = padded(kv_len);
  auto out = torch::empty({batch, q_len, heads, width}, q.options()).transpose(1, 2);
  auto lse = torch::empty({2, batch, heads, q_len}, q.options());
  const Strided Q = strided(q), K = strided(k), V = strided(v), O = strided(out);
  float* lse_data = lse.data_ptr<float>();
  const float lam = static_cast<float>(lambda_full), alpha = static_cast<float>(scale);
  const int64_t lse_map = batch * heads * q_len;

  at::parallel_for(0, batch * heads * q_blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch s1(block_q * ld), s2(block_q * ld);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (heads * q_blocks), i = item / q_blocks % heads, t0 = item % q_blocks * block_q;
      const int rows = static_cast<int>(std::min(block_q, q_len - t0));
      const float* qp = Q.at(b, i, t0);
      const float* kp = K.at(b, i / rep, 0);
      const int64_t keys = causal ? std::clamp<int64_t>(t0 + rows + offset, 0, kv_len) : kv_len;
      float* o = O.at(b, i, t0);
      if (keys == 0) {
        for (int r = 0; r < rows; ++r) std::fill(o + r * O.row, o + r * O.row + width, 0.0f);
        continue;
      }
      const int n = static_cast<int>(keys);
      gemm(false, true, rows, n, d, alpha, qp, Q.row, kp, K.row, 0.0f, s1.data(), ld);
      gemm(false, true, rows, n, d, alpha, qp + d, Q.row, kp + d, K.row, 0.0f, s2.data(), ld);
      for (int r = 0; r < rows; ++r) {
        const int64_t valid = visible(causal, t0 + r + offset, keys), at_row = (b * heads + i) * q_len + t0 + r;
        float* a1 = &s1[r * ld];
        combined_row(a1, &s2[r * ld], valid, lam, lse_data[at_row], lse_data[lse_map + at_row]);
        std::fill(a1 + valid, a1 + keys, 0.0f);
      }
      gemm(false, false, rows, width, n, 1.0f, s1.data(), ld, V.at(b, i / rep, 0), V.row, 0.0f, o, O.row);
    }
  });
  return {out, lse};
}

// Gradients of out = (A1 - lambda A2) V given grad_out and the forward's log-sum-exps. Returns dq (B, h, T, 2d),
// per-query-head dk, dv (B, h, S, 2d), which the caller sums over the heads of each KV group, and
// rowsum(grad_out * A2 V) (B, h, T), whose negated sum is lambda's gradient.
std::vector<torch::Tensor> diff_attention_backward(torch::Tensor grad_out, torch::Tensor q, torch::Tensor k,
                                                   torch::Tensor v, torch::Tensor lse, double lambda_full,
                                                   double scale, bool causal, int64_t block_q) {
  check_inputs(q, k, v);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && grad_out.stride(3) == 1, "grad_out must be q's shape, last dim contiguous");
  TORCH_CHECK(lse.is_contiguous(), "lse must be contiguous");
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2), d = width / 2, rep = heads / kv_heads;
  const int64_t offset = kv_len - q_len, ld = padded(kv_len);
  auto dq = torch::empty({batch, heads, q_len, width}, q.options());
  auto dk = torch::zeros({batch, heads, kv_len, width}, q.options());
  auto dv = torch::zeros({batch, heads, kv_len, width}, q.options());
  auto delta2 = torch::empty({batch, heads, q_len}, q.options());
  const Strided Q = strided(q), K = strided(k), V = strided(v), DO = strided(grad_out);
  const Strided DQ = strided(dq), DK = strided(dk), DV = strided(dv);
  const float* lse_data = lse.data_ptr<float>();
  float* delta2_data = delta2.data_ptr<float>();
  const float lam = static_cast<float>(lambda_full), alpha = static_cast<float>(scale);
  const int64_t per_map = batch * heads * q_len;

  // One (batch, head) per task: its dk and dv rows are written by no other task.
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    Scratch p1(block_q * ld), p2(block_q * ld), dp(block_q * ld);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / heads, i = item % heads;
      const float* kp = K.at(b, i / rep, 0);
      const float* vp = V.at(b, i / rep, 0);
      float* dkp = DK.at(b, i, 0);
      float* dvp = DV.at(b, i, 0);
      const float* lse1 = lse_data + item * q_len;
      const float* lse2 = lse1 + per_map;
      for (int64_t t0 = 0; t0 < q_len; t0 += block_q) {
        const int rows = static_cast<int>(std::min(block_q, q_len - t0));
        const float* qp = Q.at(b, i, t0);
        const float* dop = DO.at(b, i, t0);
        float* dqp = DQ.at(b, i, t0);
        const int64_t keys = causal ? std::clamp<int64_t>(t0 + rows + offset, 0, kv_len) : kv_len;
        if (keys == 0) {
          for (int r = 0; r < rows; ++r) {
            std::fill(dqp + r * DQ.row, dqp + r * DQ.row + width, 0.0f);
            delta2_data[item * q_len + t0 + r] = 0.0f;
          }
          continue;
        }
        const int n = static_cast<int>(keys);
        gemm(false, true, rows, n, d, alpha, qp, Q.row, kp, K.row, 0.0f, p1.data(), ld);
        gemm(false, true, rows, n, d, alpha, qp + d, Q.row, kp + d, K.row, 0.0f, p2.data(), ld);
        gemm(false, true, rows, n, width, 1.0f, dop, DO.row, vp, V.row, 0.0f, dp.data(), ld);
        for (int r = 0; r < rows; ++r) {
          const int64_t valid = visible(causal, t0 + r + offset, keys);
          float *a1 = &p1[r * ld], *a2 = &p2[r * ld], *g = &dp[r * ld];
          const float x1 = lse1[t0 + r], x2 = lse2[t0 + r];
          // The maps, and rowsum(dO * A_j V) = rowsum(A_j * dO V^T), which the softmax gradients subtract.
          float y1 = 0.0f, y2 = 0.0f;
#pragma omp simd reduction(+ : y1, y2)
          for (int64_t j = 0; j < valid; ++j) {
            a1[j] = exp_nonpositive(a1[j] - x1);
            a2[j] = exp_nonpositive(a2[j] - x2);
            y1 += a1[j] * g[j];
            y2 += a2[j] * g[j];
          }
          delta2_data[item * q_len + t0 + r] = y2;
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) {
            const float e1 = a1[j], e2 = a2[j], gj = g[j];
            g[j] = e1 - lam * e2;             // the combined map, for dV
            a1[j] = e1 * (gj - y1);           // dS1 (the scale goes into the products below)
            a2[j] = -lam * e2 * (gj - y2);    // dS2
          }
          std::fill(g + valid, g + keys, 0.0f);
          std::fill(a1 + valid, a1 + keys, 0.0f);
          std::fill(a2 + valid, a2 + keys, 0.0f);
        }
        gemm(true, false, n, width, rows, 1.0f, dp.data(), ld, dop, DO.row, 1.0f, dvp, DV.row);
        gemm(false, false, rows, d, n, alpha, p1.data(), ld, kp, K.row, 0.0f, dqp, DQ.row);
        gemm(false, false, rows, d, n, alpha, p2.data(), ld, kp + d, K.row, 0.0f, dqp + d, DQ.row);
        gemm(true, false, n, d, rows, alpha, p1.data(), ld, qp, Q.row, 1.0f, dkp, DK.row);
        gemm(true, false, n, d, rows, alpha, p2.data(), ld, qp + d, Q.row, 1.0f, dkp + d, DK.row);
      }
    }
  });
  return {dq, dk, dv, delta2};
}

// Inference for a few queries against a long cache (a decode step): per query, both maps' logits are dot
// products with the cached K1 | K2 rows, and the combined weights A1 - lambda A2 multiply V in ONE pass, so K
// and V are read once and the multiply-adds are the matched baseline's. Plain vectorized loops: for one query
// row, BLAS calls measured slower (their fixed cost and a strided K^T product). Returns (B, h, T, 2d) with heads
// merged in memory, like the forward above.
// With ``rotary_cos`` and ``rotary_sin`` (batch or 1, T, d/2) q is taken before its rotary embedding and rotated
// here (``rotary_half`` picks the pairing), which saves the step the rotation's tensor ops on q.
torch::Tensor diff_attention_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, double lambda_full,
                                    c10::optional<double> scale_opt, bool causal,
                                    c10::optional<torch::Tensor> rotary_cos, c10::optional<torch::Tensor> rotary_sin,
                                    bool rotary_half) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-D (batch, heads, seq, 2d); got q ",
                    q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  q = last_dim_contiguous(q);
  k = last_dim_contiguous(k);
  v = last_dim_contiguous(v);
  check_inputs(q, k, v);
  const double scale = scale_opt.has_value() ? *scale_opt : 1.0 / std::sqrt(static_cast<double>(q.size(3) / 2));
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2), d = width / 2, rep = heads / kv_heads;
  const int64_t offset = kv_len - q_len;
  const bool rotate = rotary_cos.has_value() && rotary_cos->defined();
  TORCH_CHECK_VALUE(rotate == (rotary_sin.has_value() && rotary_sin->defined()),
                    "rotary_cos and rotary_sin go together: give both or neither");
  // A table's strides over (batch, query, pair), batch 0 where one row serves every sequence.
  auto table_strides = [&](const char* name, const torch::Tensor& table) -> std::array<int64_t, 3> {
    TORCH_CHECK_VALUE(table.device().is_cpu() && table.scalar_type() == torch::kFloat32 && table.dim() == 3 &&
                          (table.size(0) == batch || table.size(0) == 1) && table.size(1) == q_len &&
                          table.size(2) == d / 2,
                      name, " must be a float32 CPU tensor (", batch, " or 1, ", q_len, ", ", d / 2, "); got ",
                      table.scalar_type(), " ", table.sizes(), " on ", table.device());
    return {table.size(0) == 1 ? 0 : table.stride(0), table.stride(1), table.stride(2)};
  };
  const auto cos_strides = rotate ? table_strides("rotary_cos", *rotary_cos) : std::array<int64_t, 3>{};
  const auto sin_strides = rotate ? table_strides("rotary_sin", *rotary_sin) : std::array<int64_t, 3>{};
  const float* cos_data = rotate ? rotary_cos->data_ptr<float>() : nullptr;
  const float* sin_data = rotate ? rotary_sin->data_ptr<float>() : nullptr;
  auto out = torch::empty({batch, q_len, heads, width}, q.options()).transpose(1, 2);
  const Strided Q = strided(q), K = strided(k), V = strided(v), O = strided(out);
  const float lam = static_cast<float>(lambda_full), alpha = static_cast<float>(scale);

  at::parallel_for(0, batch * heads * q_len, 1, [&](int64_t begin, int64_t end) {
    Scratch w1(kv_len), w2(kv_len), rotated(width);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (heads * q_len), i = item / q_len % heads, t = item % q_len;
      const float* q1 = Q.at(b, i, t);
      if (rotate) {
        rotate_query(q1, d, cos_data + b * cos_strides[0] + t * cos_strides[1], cos_strides[2],
                     sin_data + b * sin_strides[0] + t * sin_strides[1], sin_strides[2], rotary_half,
                     rotated.data());
        q1 = rotated.data();
      }
      const float* q2 = q1 + d;
      const int64_t keys = causal ? std::min(kv_len, t + offset + 1) : kv_len;
      const float* kp = K.at(b, i / rep, 0);
      const float* vp = V.at(b, i / rep, 0);
      for (int64_t j = 0; j < keys; ++j) {
        const float* kj = kp + j * K.row;
        w1[j] = dot(q1, kj, d) * alpha;
        w2[j] = dot(q2, kj + d, d) * alpha;
      }
      float lse1, lse2;  // unused: no backward
      combined_row(w1.data(), w2.data(), keys, lam, lse1, lse2);
      float* o = O.at(b, i, t);
      weighted_rows(w1.data(), vp, V.row, keys, width, o);
    }
  });
  return out;
}

// RMSNorm at inference: each row of x (its last dim, contiguous) divided by its root mean square (computed in
// float32, as ops/norm.py's rms_norm does), times ``weight`` if defined, times ``scale``. One call instead of the
// norm's eight small tensor ops, which dominate a one-token step's norms. The output keeps x's memory layout.
torch::Tensor rms_norm_inference(torch::Tensor x, c10::optional<torch::Tensor> weight, double eps, double scale) {
  TORCH_CHECK_VALUE(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() >= 1,
                    "the C++ RMSNorm takes a float32 CPU tensor; got ", x.scalar_type(), " on ", x.device());
  if (x.stride(-1) != 1 || !x.is_non_overlapping_and_dense()) x = x.contiguous();
  const int64_t width = x.size(-1), rows = width ? x.numel() / width : 0;
  const float* gain = nullptr;
  if (weight.has_value() && weight->defined()) {
    TORCH_CHECK_VALUE(weight->device().is_cpu() && weight->scalar_type() == torch::kFloat32 &&
                          weight->is_contiguous() && weight->numel() == width,
                      "the RMSNorm weight must be a contiguous float32 CPU vector of x's last dim (", width,
                      "); got ", weight->scalar_type(), " ", weight->sizes());
    gain = weight->data_ptr<float>();
  }
  // Same strides as x: rows are the same memory chunks of ``width`` floats in both.
  auto out = torch::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const float factor_scale = static_cast<float>(scale), epsilon = static_cast<float>(eps);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = src + r * width;
      float* o = dst + r * width;
      const float inv_rms = 1.0f / std::sqrt(dot(row, row, width) / static_cast<float>(width) + epsilon);
      if (gain) {
        for (int64_t c = 0; c < width; ++c) o[c] = row[c] * inv_rms * (gain[c] * factor_scale);
      } else {
        for (int64_t c = 0; c < width; ++c) o[c] = row[c] * inv_rms * factor_scale;
      }
    }
  });
  return out;
}

// DIFF V1's lambda at inference: exp(q1 . k1) - exp(q2 . k2) + lambda_init from the four float32 vectors, summed in
// double. One call instead of the formula's eight small tensor ops per layer and step.
double lambda_full_inference(torch::Tensor q1, torch::Tensor k1, torch::Tensor q2, torch::Tensor k2,
                             double lambda_init) {
  const int64_t n = q1.numel();
  for (const auto* x : {&q1, &k1, &q2, &k2}) {
    TORCH_CHECK_VALUE(x->device().is_cpu() && x->scalar_type() == torch::kFloat32 && x->is_contiguous() &&
                          x->numel() == n,
                      "the lambda vectors must be contiguous float32 CPU tensors of one length; got ",
                      x->scalar_type(), " ", x->sizes(), " on ", x->device());
  }
  auto dot64 = [n](const torch::Tensor& a, const torch::Tensor& b) {
    const float* x = a.data_ptr<float>();
    const float* y = b.data_ptr<float>();
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(y[i]);
    return sum;
  };
  return std::exp(dot64(q1, k1)) - std::exp(dot64(q2, k2)) + lambda_init;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm_inference, "RMSNorm over the last dim, inference (CPU float32)");
  m.def("lambda_full", &lambda_full_inference, "DIFF V1's lambda from its four vectors, inference (CPU float32)");
  m.def("decode", &diff_attention_decode, "differential attention for a few queries, inference (CPU float32)");
  m.def("forward", &diff_attention_forward, "fused differential attention, forward (CPU float32)");
  m.def("backward", &diff_attention_backward, "fused differential attention, backward (CPU float32)");
}
