// A probe, not the product: CIOSL's BayesHead._step (the CIOSL case: every labelled row scored,
// k draws, one training draw, entropy uncertainty) as ATen calls from C++, so that no Python runs
// inside the step. benchmarks/compiled_step.py builds it with torch.utils.cpp_extension and
// times it against the Python step on the same stream (issue 14).
#include <torch/extension.h>
#include <cmath>
#include <vector>
using torch::Tensor;

// views [W1,b1,W2,b2,...] of a flat tensor
static std::vector<Tensor> views(const Tensor& flat, const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<Tensor> out; int64_t o = 0;
  for (auto& s : shapes) { int64_t n = 1; for (auto v : s) n *= v; out.push_back(flat.narrow(0, o, n).view(s)); o += n; }
  return out;
}

// one CIOSL step on rows X (n,d): first n_ce labelled (Y), rest distilled to H under mask.
// scored rows = n_ce, k draws. Returns (loss, unc, hmean).
std::vector<Tensor> step(Tensor X, Tensor Y, Tensor H, Tensor mask, Tensor noise,
                         Tensor mu, Tensor fisher, Tensor prec0, Tensor prior_mu, Tensor prior_prec,
                         Tensor buf, Tensor grad, Tensor scratch, std::vector<std::vector<int64_t>> shapes,
                         int64_t k, double fisher_weight, double fisher_decay, double lambda2,
                         double kl_scale, double prior_prec_max, double max_curv, double max_norm,
                         double lr, double momentum, double wd, at::Generator gen) {
  torch::NoGradGuard ng;
  const int64_t n = X.size(0), m = Y.size(0), L = shapes.size() / 2;
  auto mu_l = views(mu, shapes), f_l = views(fisher, shapes), g_l = views(grad, shapes);
  Tensor var = scratch[0];
  at::add_out(var, prec0, fisher, fisher_weight); var.reciprocal_();
  auto v = views(var, shapes);
  std::vector<int64_t> widths; for (int64_t i = 0; i < L; i++) widths.push_back(shapes[2*i+1][0]);
  auto eps = noise.split_with_sizes(widths, 1);
  const int64_t j = k - 1;
  std::vector<Tensor> hs, h2s, Ss, Es;
  Tensor h = X;
  for (int64_t i = 0; i < L; i++) {
    Tensor h2 = h * h;
    Tensor M = at::addmm(mu_l[2*i+1], h, mu_l[2*i].t());
    Tensor S = at::addmm(v[2*i+1], h2, v[2*i].t()).sqrt_();
    Tensor A;
    if (i == 0 && j) {
      A = at::empty({n + m * j, M.size(1)}, M.options());
      Tensor A0 = A.narrow(0, 0, n);
      at::addcmul_out(A0, M, S, eps[0].narrow(0, 0, n));
      auto Av = A.narrow(0, n, m * j).view({j, m, -1});
      at::addcmul_out(Av, M.narrow(0, 0, m).expand({j, m, -1}), S.narrow(0, 0, m).expand({j, m, -1}),
                      eps[0].narrow(0, n, m * j).view({j, m, -1}));
    } else {
      A = at::addcmul(M, S, eps[i]);
    }
    hs.push_back(h.narrow(0, 0, n)); h2s.push_back(h2.narrow(0, 0, n));
    Ss.push_back(S.narrow(0, 0, n)); Es.push_back(eps[i].narrow(0, 0, n));
    h = i < L - 1 ? A.relu_() : A;
  }
  Tensor logits = h;  // (R, C)
  Tensor P = logits.softmax(1);
  // scores
  Tensor loss = at::cross_entropy_loss(logits.narrow(0, 0, m), Y, {}, at::Reduction::None);
  Tensor p = P.narrow(0, n, m * j).view({j, m, -1}).sum(0).add_(P.narrow(0, 0, m)).div_(k);
  Tensor hm = logits.narrow(0, n, m * j).view({j, m, -1}).sum(0).add_(logits.narrow(0, 0, m)).div_(k);
  Tensor unc = at::special_entr(p).sum(1);
  // Fisher rows
  Tensor drawn = at::multinomial(P.narrow(0, 0, m), 1, false, gen).select(1, 0);
  Tensor G = P.narrow(0, 0, m).clone();
  Tensor ar = at::arange(m, Y.options());
  G.index_put_({ar, drawn}, at::full({}, -1.0, G.options()), true);
  // dlogits
  Tensor g = P.narrow(0, 0, n);
  g.index_put_({ar, Y}, at::full({}, -1.0, g.options()), true);
  g.narrow(0, 0, m).div_(m);
  if (n > m) {
    Tensor d = g.narrow(0, m, n - m);
    at::sub_out(d, logits.narrow(0, m, n - m), H).mul_(mask);
    d.mul_(2.0 * lambda2 / (n - m));
  }
  // backward
  for (int64_t i = L - 1; i >= 0; i--) {
    at::mm_out(g_l[2*i], g.t(), hs[i]);
    at::sum_out(g_l[2*i+1], g, at::IntArrayRef{0});
    if (i) {
      Tensor gV = at::mul(g, Es[i]).div_(Ss[i]);
      g = at::addcmul(g.mm(mu_l[2*i]), gV.mm(v[2*i]), hs[i]);
      g = at::threshold_backward(g, hs[i], 0.0);
    }
  }
  // fisher
  {
    double keep = 1.0 - fisher_decay, rate = fisher_decay;
    Tensor gg = G / std::sqrt((double)m);
    for (int64_t i = L - 1; i >= 0; i--) {
      Tensor g2 = gg * gg;
      f_l[2*i].addmm_(g2.t(), h2s[i].narrow(0, 0, m), keep, rate);
      f_l[2*i+1].mul_(keep).add_(g2.sum(0), rate);
      if (i) gg = at::threshold_backward(gg.mm(mu_l[2*i]), hs[i].narrow(0, 0, m), 0.0);
    }
  }
  // KL grad
  if (kl_scale != 0.0) {
    Tensor d = scratch[1];
    at::sub_out(d, mu, prior_mu);
    if (kl_scale * prior_prec_max > max_curv) { d.mul_(prior_prec.clamp(c10::nullopt, max_curv / kl_scale)); grad.add_(d, kl_scale); }
    else grad.addcmul_(d, prior_prec, kl_scale);
  }
  // clip
  double norm = grad.norm().item<double>();
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) grad.mul_(coef);
  // SGD
  grad.add_(mu, wd);
  buf.mul_(momentum).add_(grad);
  mu.add_(buf, -lr);
  return {loss, unc, hm};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("step", &step); }
