// The transformer's pass on one device. Rows are tokens (batch x positions,
// row n = sequence n / positions, position n % positions); a layer's inputs
// and intermediates are kept from its forward for its backward.
#include "model.h"

#include <algorithm>

#include "ops.h"

namespace dew::train {
namespace {

// Views of one bucket's parameters, this tensor rank's parts.
template <typename T>
struct Views {
  std::vector<const T*> params;
  std::vector<T*> grads;
};

template <typename T>
Views<T> views(const std::vector<ParamSpec>& bucket, int tensor_size, std::span<const T> params, std::span<T> grads) {
  const BucketLayout layout = bucket_layout(bucket, tensor_size);
  Views<T> v;
  for (std::size_t i = 0; i < bucket.size(); ++i) {
    v.params.push_back(params.data() + layout.offsets[i]);
    v.grads.push_back(grads.data() + layout.offsets[i]);
  }
  return v;
}

// Token-major rows (n, head * width + d) <-> attention's layout
// (sequence, head, position, d), both directions.
template <typename T>
void to_heads(const T* rows, int batch, int positions, int heads, int width, T* out) {
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < positions; ++p)
        std::copy_n(rows + (std::size_t(b) * positions + p) * heads * width + std::size_t(h) * width, width,
                    out + ((std::size_t(b) * heads + h) * positions + p) * width);
}

template <typename T>
void from_heads(const T* in, int batch, int positions, int heads, int width, T* rows) {
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < positions; ++p)
        std::copy_n(in + ((std::size_t(b) * heads + h) * positions + p) * width, width,
                    rows + (std::size_t(b) * positions + p) * heads * width + std::size_t(h) * width);
}

template <typename T>
struct LayerState {
  std::vector<T> x, inv1, z1, q, k, v, qh, kh, vh, out, lse, a, h, inv2, z2, u, act;
};

// The dimensions every step of a pass uses.
struct Dims {
  int n, width, head, heads, kv_heads, mlp;  // heads, kv_heads and mlp: this tensor rank's
};

template <typename T>
Result<Done> layer_forward(const Dims& d, const DeviceShape& shape, const Views<T>& w, LayerState<T>& s,
                           std::vector<T>& x, Collectives<T>& c) {
  const int n = d.n, qw = d.heads * d.head, kw = d.kv_heads * d.head;
  s.x = x;
  s.inv1.resize(n), s.z1.resize(x.size());
  rmsnorm_forward<T>(s.x, {w.params[0], std::size_t(d.width)}, n, d.width, s.z1, s.inv1);
  s.q.assign(std::size_t(n) * qw, 0), s.k.assign(std::size_t(n) * kw, 0), s.v.assign(std::size_t(n) * kw, 0);
  gemm<T>(false, false, n, qw, d.width, 1, s.z1.data(), w.params[1], 0, s.q.data());
  gemm<T>(false, false, n, kw, d.width, 1, s.z1.data(), w.params[2], 0, s.k.data());
  gemm<T>(false, false, n, kw, d.width, 1, s.z1.data(), w.params[3], 0, s.v.data());
  s.qh.resize(s.q.size()), s.kh.resize(s.k.size()), s.vh.resize(s.v.size());
  to_heads(s.q.data(), shape.batch, shape.positions, d.heads, d.head, s.qh.data());
  to_heads(s.k.data(), shape.batch, shape.positions, d.kv_heads, d.head, s.kh.data());
  to_heads(s.v.data(), shape.batch, shape.positions, d.kv_heads, d.head, s.vh.data());
  s.out.assign(s.q.size(), 0), s.lse.assign(std::size_t(shape.batch) * d.heads * shape.positions, 0);
  if (auto r = c.attention_forward({s.qh.data(), s.kh.data(), s.vh.data()}, s.out.data(), s.lse.data()); !r.ok()) {
    return r.error();
  }
  s.a.resize(s.q.size());
  from_heads(s.out.data(), shape.batch, shape.positions, d.heads, d.head, s.a.data());
  std::vector<T> o(x.size(), 0);
  gemm<T>(false, false, n, d.width, qw, 1, s.a.data(), w.params[4], 0, o.data());
  if (auto r = c.tensor_sum(o); !r.ok()) return r.error();
  s.h = s.x;
  for (std::size_t i = 0; i < o.size(); ++i) s.h[i] += o[i];
  s.inv2.resize(n), s.z2.resize(x.size());
  rmsnorm_forward<T>(s.h, {w.params[5], std::size_t(d.width)}, n, d.width, s.z2, s.inv2);
  s.u.assign(std::size_t(n) * d.mlp, 0), s.act.resize(s.u.size());
  gemm<T>(false, false, n, d.mlp, d.width, 1, s.z2.data(), w.params[6], 0, s.u.data());
  silu_forward<T>(s.u, s.act);
  std::vector<T> m(x.size(), 0);
  gemm<T>(false, false, n, d.width, d.mlp, 1, s.act.data(), w.params[7], 0, m.data());
  if (auto r = c.tensor_sum(m); !r.ok()) return r.error();
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = s.h[i] + m[i];
  return Done{};
}

// dx: the gradient at the layer's output in, at its input out.
template <typename T>
Result<Done> layer_backward(const Dims& d, const DeviceShape& shape, const Views<T>& w, const LayerState<T>& s,
                            std::vector<T>& dx, Collectives<T>& c) {
  const int n = d.n, qw = d.heads * d.head, kw = d.kv_heads * d.head;
  // MLP: x = h + act . w2, act = silu(z2 . w1), z2 = norm(h).
  std::vector<T> d_act(s.u.size(), 0), du(s.u.size());
  gemm<T>(false, true, n, d.mlp, d.width, 1, dx.data(), w.params[7], 0, d_act.data());
  gemm<T>(true, false, d.mlp, d.width, n, 1, s.act.data(), dx.data(), 1, w.grads[7]);
  silu_backward<T>(s.u, d_act, du);
  gemm<T>(true, false, d.width, d.mlp, n, 1, s.z2.data(), du.data(), 1, w.grads[6]);
  std::vector<T> dz(dx.size(), 0), dn(dx.size());
  gemm<T>(false, true, n, d.width, d.mlp, 1, du.data(), w.params[6], 0, dz.data());
  if (auto r = c.tensor_sum(dz); !r.ok()) return r.error();
  rmsnorm_backward<T>(s.h, {w.params[5], std::size_t(d.width)}, s.inv2, dz, n, d.width, dn,
                      {w.grads[5], std::size_t(d.width)});
  std::vector<T> dh = dx;
  for (std::size_t i = 0; i < dh.size(); ++i) dh[i] += dn[i];
  // Attention: h = x + a . wo.
  std::vector<T> da(s.a.size(), 0), dout(s.a.size());
  gemm<T>(false, true, n, qw, d.width, 1, dh.data(), w.params[4], 0, da.data());
  gemm<T>(true, false, qw, d.width, n, 1, s.a.data(), dh.data(), 1, w.grads[4]);
  to_heads(da.data(), shape.batch, shape.positions, d.heads, d.head, dout.data());
  std::vector<T> dqh(s.qh.size()), dkh(s.kh.size()), dvh(s.vh.size());
  if (auto r = c.attention_backward({s.qh.data(), s.kh.data(), s.vh.data()}, s.out.data(), s.lse.data(), dout.data(),
                                    dqh.data(), dkh.data(), dvh.data());
      !r.ok()) {
    return r.error();
  }
  std::vector<T> dq(s.q.size()), dk(s.k.size()), dv(s.v.size());
  from_heads(dqh.data(), shape.batch, shape.positions, d.heads, d.head, dq.data());
  from_heads(dkh.data(), shape.batch, shape.positions, d.kv_heads, d.head, dk.data());
  from_heads(dvh.data(), shape.batch, shape.positions, d.kv_heads, d.head, dv.data());
  gemm<T>(true, false, d.width, qw, n, 1, s.z1.data(), dq.data(), 1, w.grads[1]);
  gemm<T>(true, false, d.width, kw, n, 1, s.z1.data(), dk.data(), 1, w.grads[2]);
  gemm<T>(true, false, d.width, kw, n, 1, s.z1.data(), dv.data(), 1, w.grads[3]);
  std::fill(dz.begin(), dz.end(), T(0));
  gemm<T>(false, true, n, d.width, qw, 1, dq.data(), w.params[1], 0, dz.data());
  gemm<T>(false, true, n, d.width, kw, 1, dk.data(), w.params[2], 1, dz.data());
  gemm<T>(false, true, n, d.width, kw, 1, dv.data(), w.params[3], 1, dz.data());
  if (auto r = c.tensor_sum(dz); !r.ok()) return r.error();
  rmsnorm_backward<T>(s.x, {w.params[0], std::size_t(d.width)}, s.inv1, dz, n, d.width, dn,
                      {w.grads[0], std::size_t(d.width)});
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = dh[i] + dn[i];
  return Done{};
}

}  // namespace

template <typename T>
Result<double> forward_backward(const ModelConfig& model, const DeviceShape& shape,
                                const std::vector<std::vector<ParamSpec>>& buckets,
                                const std::vector<std::span<const T>>& params, std::span<const int> tokens,
                                std::span<const int> targets, T scale, const std::vector<std::span<T>>& gradients,
                                Collectives<T>& collectives) {
  const int t = shape.tensor_size;
  const Dims d{shape.batch * shape.positions,
               model.width,
               model.width / model.heads,
               model.heads / t,
               model.kv_heads / t,
               model.mlp / t};
  const auto embed = views<T>(buckets[0], t, params[0], gradients[0]);
  // Embedding and positions.
  std::vector<T> x(std::size_t(d.n) * d.width);
  for (int row = 0; row < d.n; ++row) {
    const T* e = embed.params[0] + std::size_t(tokens[row]) * d.width;
    const T* p = embed.params[1] + std::size_t(shape.global_positions[row % shape.positions]) * d.width;
    for (int i = 0; i < d.width; ++i) x[std::size_t(row) * d.width + i] = e[i] + p[i];
  }
  std::vector<LayerState<T>> states(std::size_t(model.layers));
  for (int l = 0; l < model.layers; ++l) {
    const auto w = views<T>(buckets[l + 1], t, params[l + 1], gradients[l + 1]);
    if (auto r = layer_forward(d, shape, w, states[l], x, collectives); !r.ok()) return r.error();
  }
  // Final norm, the tied output projection, the loss.
  std::vector<T> inv(d.n), y(x.size()), logits(std::size_t(d.n) * model.vocab, 0), d_logits(logits.size());
  rmsnorm_forward<T>(x, {embed.params[2], std::size_t(d.width)}, d.n, d.width, y, inv);
  gemm<T>(false, true, d.n, model.vocab, d.width, 1, y.data(), embed.params[0], 0, logits.data());
  const double loss = cross_entropy<T>(logits, targets, d.n, model.vocab, scale, d_logits);
  std::vector<T> dy(x.size(), 0), dx(x.size());
  gemm<T>(false, false, d.n, d.width, model.vocab, 1, d_logits.data(), embed.params[0], 0, dy.data());
  gemm<T>(true, false, model.vocab, d.width, d.n, 1, d_logits.data(), y.data(), 1, embed.grads[0]);
  rmsnorm_backward<T>(x, {embed.params[2], std::size_t(d.width)}, inv, dy, d.n, d.width, dx,
                      {embed.grads[2], std::size_t(d.width)});
  for (int l = model.layers - 1; l >= 0; --l) {
    const auto w = views<T>(buckets[l + 1], t, params[l + 1], gradients[l + 1]);
    if (auto r = layer_backward(d, shape, w, states[l], dx, collectives); !r.ok()) return r.error();
  }
  for (int row = 0; row < d.n; ++row) {
    T* e = embed.grads[0] + std::size_t(tokens[row]) * d.width;
    T* p = embed.grads[1] + std::size_t(shape.global_positions[row % shape.positions]) * d.width;
    for (int i = 0; i < d.width; ++i) {
      e[i] += dx[std::size_t(row) * d.width + i];
      p[i] += dx[std::size_t(row) * d.width + i];
    }
  }
  return loss;
}

template Result<double> forward_backward<float>(const ModelConfig&, const DeviceShape&,
                                                const std::vector<std::vector<ParamSpec>>&,
                                                const std::vector<std::span<const float>>&, std::span<const int>,
                                                std::span<const int>, float, const std::vector<std::span<float>>&,
                                                Collectives<float>&);
template Result<double> forward_backward<double>(const ModelConfig&, const DeviceShape&,
                                                 const std::vector<std::vector<ParamSpec>>&,
                                                 const std::vector<std::span<const double>>&, std::span<const int>,
                                                 std::span<const int>, double, const std::vector<std::span<double>>&,
                                                 Collectives<double>&);

}  // namespace dew::train
