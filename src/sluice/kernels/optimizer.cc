#include "sluice/kernels/optimizer.h"

#include <cmath>

namespace sluice::kernels {

template <typename T>
void SgdUpdateReference(T* param, const T* grad, T* momentum_buf, int64_t n, const SgdHyper& h,
                        double lr) {
  for (int64_t i = 0; i < n; ++i) {
    T d = grad[i] + static_cast<T>(h.weight_decay) * param[i];
    if (h.momentum != 0) {
      momentum_buf[i] = static_cast<T>(h.momentum) * momentum_buf[i] + d;
      d = momentum_buf[i];
    }
    param[i] = param[i] - static_cast<T>(lr) * d;
  }
}

template <typename T>
void SgdUpdateFast(T* param, const T* grad, T* momentum_buf, int64_t n, const SgdHyper& h,
                   double lr) {
  T* __restrict p = param;
  const T* __restrict g = grad;
  T* __restrict buf = momentum_buf;
  const T wd = static_cast<T>(h.weight_decay), mu = static_cast<T>(h.momentum),
          rate = static_cast<T>(lr);
  if (h.momentum != 0) {
    for (int64_t i = 0; i < n; ++i) {
      buf[i] = mu * buf[i] + (g[i] + wd * p[i]);
      p[i] = p[i] - rate * buf[i];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] - rate * (g[i] + wd * p[i]);
  }
}

template <typename T>
void AdamWUpdateReference(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& h,
                          double lr, double step) {
  for (int64_t i = 0; i < n; ++i) {
    // Decoupled weight decay shrinks the parameter itself, not the gradient.
    param[i] = param[i] * static_cast<T>(1 - lr * h.weight_decay);
    // First and second moment estimates, exponentially averaged.
    m[i] = static_cast<T>(h.beta1) * m[i] + static_cast<T>(1 - h.beta1) * grad[i];
    v[i] = static_cast<T>(h.beta2) * v[i] + static_cast<T>(1 - h.beta2) * grad[i] * grad[i];
    // Bias correction: the averages start at 0, so divide out the weight they have accumulated.
    const double bias1 = 1 - std::pow(h.beta1, step);
    const double bias2 = 1 - std::pow(h.beta2, step);
    const T denom = std::sqrt(v[i]) / static_cast<T>(std::sqrt(bias2)) + static_cast<T>(h.eps);
    param[i] = param[i] - static_cast<T>(lr / bias1) * (m[i] / denom);
  }
}

template <typename T>
void AdamWUpdateFast(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& h, double lr,
                     double step) {
  T* __restrict p = param;
  const T* __restrict g = grad;
  T* __restrict mp = m;
  T* __restrict vp = v;
  const T decay = static_cast<T>(1 - lr * h.weight_decay);
  const T b1 = static_cast<T>(h.beta1), c1 = static_cast<T>(1 - h.beta1);
  const T b2 = static_cast<T>(h.beta2), c2 = static_cast<T>(1 - h.beta2);
  const T step_size = static_cast<T>(lr / (1 - std::pow(h.beta1, step)));
  const T bias2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(h.beta2, step)));
  const T eps = static_cast<T>(h.eps);
  for (int64_t i = 0; i < n; ++i) {
    const T mi = b1 * mp[i] + c1 * g[i];
    const T vi = b2 * vp[i] + c2 * g[i] * g[i];
    mp[i] = mi;
    vp[i] = vi;
    p[i] = p[i] * decay - step_size * (mi / (std::sqrt(vi) / bias2_sqrt + eps));
  }
}

template void SgdUpdateReference<float>(float*, const float*, float*, int64_t, const SgdHyper&,
                                        double);
template void SgdUpdateReference<double>(double*, const double*, double*, int64_t, const SgdHyper&,
                                         double);
template void SgdUpdateFast<float>(float*, const float*, float*, int64_t, const SgdHyper&, double);
template void SgdUpdateFast<double>(double*, const double*, double*, int64_t, const SgdHyper&,
                                    double);
template void AdamWUpdateReference<float>(float*, const float*, float*, float*, int64_t,
                                          const AdamWHyper&, double, double);
template void AdamWUpdateReference<double>(double*, const double*, double*, double*, int64_t,
                                           const AdamWHyper&, double, double);
template void AdamWUpdateFast<float>(float*, const float*, float*, float*, int64_t,
                                     const AdamWHyper&, double, double);
template void AdamWUpdateFast<double>(double*, const double*, double*, double*, int64_t,
                                      const AdamWHyper&, double, double);

}  // namespace sluice::kernels
