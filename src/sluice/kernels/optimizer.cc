#include "sluice/kernels/optimizer.h"

#include <cmath>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

template <typename T>
void SgdUpdateReference(const T* param, const T* grad, const T* momentum_buf, T* param_out,
                        T* momentum_out, int64_t n, const SgdHyper& h, double lr) {
  for (int64_t i = 0; i < n; ++i) {
    const T p = param[i];  // read before either output is written: an output may be its input
    T d = grad[i] + static_cast<T>(h.weight_decay) * p;
    if (h.momentum != 0) {
      d = static_cast<T>(h.momentum) * momentum_buf[i] + d;
      momentum_out[i] = d;
    }
    param_out[i] = p - static_cast<T>(lr) * d;
  }
}

template <typename T>
void SgdUpdateReference(T* param, const T* grad, T* momentum_buf, int64_t n, const SgdHyper& h,
                        double lr) {
  SgdUpdateReference<T>(param, grad, momentum_buf, param, momentum_buf, n, h, lr);
}

template <typename T>
void SgdUpdateFast(const T* param, const T* grad, const T* momentum_buf, T* param_out,
                   T* momentum_out, int64_t n, const SgdHyper& h, double lr) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    const bool momentum = momentum_buf != nullptr && momentum_out != nullptr;
    Simd<T>().sgd(param + begin, grad + begin, momentum ? momentum_buf + begin : nullptr,
                  param_out + begin, momentum ? momentum_out + begin : nullptr, end - begin,
                  static_cast<T>(h.weight_decay), static_cast<T>(h.momentum), static_cast<T>(lr));
  });
}

template <typename T>
void SgdUpdateFast(T* param, const T* grad, T* momentum_buf, int64_t n, const SgdHyper& h,
                   double lr) {
  SgdUpdateFast<T>(param, grad, momentum_buf, param, momentum_buf, n, h, lr);
}

template <typename T>
void AdamWUpdateReference(const T* param, const T* grad, const T* m, const T* v, T* param_out,
                          T* m_out, T* v_out, int64_t n, const AdamWHyper& h, double lr,
                          double step) {
  for (int64_t i = 0; i < n; ++i) {
    // Decoupled weight decay shrinks the parameter itself, not the gradient.
    const T p = param[i] * static_cast<T>(1 - lr * h.weight_decay);
    // First and second moment estimates, exponentially averaged.
    const T mi = static_cast<T>(h.beta1) * m[i] + static_cast<T>(1 - h.beta1) * grad[i];
    const T vi = static_cast<T>(h.beta2) * v[i] + static_cast<T>(1 - h.beta2) * grad[i] * grad[i];
    // Bias correction: the averages start at 0, so divide out the weight they have accumulated.
    const double bias1 = 1 - std::pow(h.beta1, step);
    const double bias2 = 1 - std::pow(h.beta2, step);
    const T denom = std::sqrt(vi) / static_cast<T>(std::sqrt(bias2)) + static_cast<T>(h.eps);
    // Every input of element i is read above: an output may be its input (in place).
    m_out[i] = mi;
    v_out[i] = vi;
    param_out[i] = p - static_cast<T>(lr / bias1) * (mi / denom);
  }
}

template <typename T>
void AdamWUpdateReference(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& h,
                          double lr, double step) {
  AdamWUpdateReference<T>(param, grad, m, v, param, m, v, n, h, lr, step);
}

template <typename T>
void AdamWUpdateFast(const T* param, const T* grad, const T* m, const T* v, T* param_out, T* m_out,
                     T* v_out, int64_t n, const AdamWHyper& h, double lr, double step) {
  const AdamWScalars<T> s{
      .decay = static_cast<T>(1 - lr * h.weight_decay),
      .beta1 = static_cast<T>(h.beta1),
      .one_minus_beta1 = static_cast<T>(1 - h.beta1),
      .beta2 = static_cast<T>(h.beta2),
      .one_minus_beta2 = static_cast<T>(1 - h.beta2),
      .step_size = static_cast<T>(lr / (1 - std::pow(h.beta1, step))),
      .bias2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(h.beta2, step))),
      .eps = static_cast<T>(h.eps),
  };
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    Simd<T>().adamw(param + begin, grad + begin, m + begin, v + begin, param_out + begin,
                    m_out + begin, v_out + begin, end - begin, s);
  });
}

template <typename T>
void AdamWUpdateFast(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& h, double lr,
                     double step) {
  AdamWUpdateFast<T>(param, grad, m, v, param, m, v, n, h, lr, step);
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

template void SgdUpdateReference<float>(const float*, const float*, const float*, float*, float*,
                                        int64_t, const SgdHyper&, double);
template void SgdUpdateReference<double>(const double*, const double*, const double*, double*,
                                         double*, int64_t, const SgdHyper&, double);
template void SgdUpdateFast<float>(const float*, const float*, const float*, float*, float*,
                                   int64_t, const SgdHyper&, double);
template void SgdUpdateFast<double>(const double*, const double*, const double*, double*, double*,
                                    int64_t, const SgdHyper&, double);
template void AdamWUpdateReference<float>(const float*, const float*, const float*, const float*,
                                          float*, float*, float*, int64_t, const AdamWHyper&,
                                          double, double);
template void AdamWUpdateReference<double>(const double*, const double*, const double*,
                                           const double*, double*, double*, double*, int64_t,
                                           const AdamWHyper&, double, double);
template void AdamWUpdateFast<float>(const float*, const float*, const float*, const float*, float*,
                                     float*, float*, int64_t, const AdamWHyper&, double, double);
template void AdamWUpdateFast<double>(const double*, const double*, const double*, const double*,
                                      double*, double*, double*, int64_t, const AdamWHyper&, double,
                                      double);

}  // namespace sluice::kernels
