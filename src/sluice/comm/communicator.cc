#include "sluice/comm/communicator.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace sluice {

namespace {

std::chrono::milliseconds ClampTimeout(std::string_view who, std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) {
    throw InvalidArgument(
        fmt::format("{}: timeout must not be negative, got {} ms", who, timeout.count()));
  }
  return std::min(timeout, kMaxTimeout);
}

}  // namespace

std::string_view Name(RequestState state) { return EnumName(kRequestStateNames, state); }

std::string DescribeTensor(DType dtype, const Shape& shape) {
  return fmt::format("{}{}", Name(dtype), shape.ToString());
}

// ---- Request ------------------------------------------------------------------------------------

RequestImpl& Request::impl() const {
  if (!impl_)
    throw InvalidArgument("Request: this request is empty (default-constructed or moved from)");
  return *impl_;
}

Tensor Request::Wait() { return Wait(default_timeout_); }

Tensor Request::Wait(std::chrono::milliseconds timeout) {
  RequestImpl& request = impl();
  return request.Wait(ClampTimeout(request.Describe(), timeout));
}

bool Request::Test() { return impl().Test(); }

RequestState Request::state() const { return impl().state(); }

std::string Request::Describe() const { return impl().Describe(); }

// ---- Communicator -------------------------------------------------------------------------------

void Communicator::CheckPeerAndTag(std::string_view what, int peer, int tag) const {
  if (peer < 0 || peer >= size()) {
    throw InvalidArgument(
        fmt::format("rank {}: {}: peer {} is not a rank of this communicator "
                    "(ranks 0..{})",
                    rank(), what, peer, size() - 1));
  }
  if (tag < 0 || tag > kMaxTag) {
    throw InvalidArgument(fmt::format("rank {}: {} rank {}: tag {} is outside [0, {}]", rank(),
                                      what, peer, tag, kMaxTag));
  }
}

std::chrono::milliseconds Communicator::CheckTimeout(std::string_view what,
                                                     std::chrono::milliseconds timeout) const {
  return ClampTimeout(fmt::format("rank {}: {}", rank(), what), timeout);
}

Request Communicator::Isend(const Tensor& tensor, int peer, int tag) {
  CheckPeerAndTag("send to", peer, tag);
  if (!tensor.defined()) {
    throw InvalidArgument(fmt::format("rank {}: send to rank {} (tag {}): the tensor is undefined",
                                      rank(), peer, tag));
  }
  return DoIsend(tensor, peer, tag);
}

Request Communicator::Irecv(int peer, int tag, DType dtype, const Shape& shape,
                            Allocator& allocator) {
  CheckPeerAndTag("receive from", peer, tag);
  return DoIrecv(peer, tag, dtype, shape, allocator);
}

void Communicator::Send(const Tensor& tensor, int peer, int tag) {
  Isend(tensor, peer, tag).Wait();
}

Tensor Communicator::Recv(int peer, int tag, DType dtype, const Shape& shape,
                          Allocator& allocator) {
  return Irecv(peer, tag, dtype, shape, allocator).Wait();
}

void Communicator::Barrier() { Barrier(default_timeout()); }

void Communicator::Barrier(std::chrono::milliseconds timeout) {
  DoBarrier(CheckTimeout("barrier", timeout));
}

void Communicator::AllReduceSum(const Tensor& tensor) { AllReduceSum(tensor, default_timeout()); }

void Communicator::CheckReducible(std::string_view what, const Tensor& tensor) const {
  if (!tensor.defined()) {
    throw InvalidArgument(fmt::format("rank {}: {}: the tensor is undefined", rank(), what));
  }
  const DType dtype = tensor.dtype();
  if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kI32 &&
      dtype != DType::kI64) {
    throw InvalidArgument(
        fmt::format("rank {}: {} of {}: only f32, f64, i32 and i64 "
                    "can be summed",
                    rank(), what, DescribeTensor(dtype, tensor.shape())));
  }
  if (!tensor.is_contiguous()) {
    throw InvalidArgument(
        fmt::format("rank {}: {} of {}: the tensor must be "
                    "contiguous (reduce a Contiguous() copy and copy it back)",
                    rank(), what, DescribeTensor(dtype, tensor.shape())));
  }
}

void Communicator::AllReduceSum(const Tensor& tensor, std::chrono::milliseconds timeout) {
  CheckReducible("all_reduce_sum", tensor);
  DoAllReduceSum(tensor, CheckTimeout("all_reduce_sum", timeout));
}

Request Communicator::IallReduceSum(const Tensor& tensor) {
  CheckReducible("iall_reduce_sum", tensor);
  return DoIallReduceSum(tensor);
}

namespace {

// The Request of a reduction that completed inside its post (DoIallReduceSum's default).
class CompletedReduction final : public RequestImpl {
 public:
  CompletedReduction(Tensor tensor, std::string what)
      : tensor_(std::move(tensor)), what_(std::move(what)) {}
  Tensor Wait(std::chrono::milliseconds) override { return tensor_; }
  bool Test() override { return true; }
  RequestState state() const override { return RequestState::kCompleted; }
  std::string Describe() const override { return what_; }

 private:
  Tensor tensor_;
  std::string what_;
};

}  // namespace

Request Communicator::DoIallReduceSum(const Tensor& tensor) {
  DoAllReduceSum(tensor, default_timeout());
  return Request(std::make_shared<CompletedReduction>(
                     tensor, fmt::format("rank {}: all_reduce_sum of {}", rank(),
                                         DescribeTensor(tensor.dtype(), tensor.shape()))),
                 default_timeout());
}

}  // namespace sluice
