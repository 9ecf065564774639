// NcclLink and nccl_gradient_sum on real devices: a 1-rank all-reduce on one GPU, and with two
// GPUs a link carrying three micro-batches of activations from device 0 to device 1 (a thread
// per device, each its own NCCL rank). Exits 77 (CTest: skipped) without a device.
#include <cstdio>
#include <thread>
#include <vector>

#include "xpipe/comm/nccl_link.cuh"

using namespace xpipe;

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what);
  }
}

// Sum over one replica is the gradient itself.
void one_rank_all_reduce() {
  ncclComm_t comm;
  int dev = 0;
  XPIPE_NCCL_CHECK(ncclCommInitAll(&comm, 1, &dev));
  cudaStream_t s;
  XPIPE_CUDA_CHECK(cudaStreamCreate(&s));
  std::vector<float> h{1.5f, -2.f, 0.25f, 8.f};
  DeviceBuffer<float> g(4);
  g.copy_from_host(h.data(), 4);
  nccl_gradient_sum({g.data(), 4}, comm, s);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> back(4);
  g.copy_to_host(back.data(), 4);
  check(back == h, "a 1-rank ncclAllReduce changed the gradient");
  cudaStreamDestroy(s);
  ncclCommDestroy(comm);
}

// Device 0 sends micro-batches 0, 1, 2 (4, 4 and 3 rows of 8 floats, value 100 g + i); device 1
// receives them through receives enqueued ahead and checks every float.
void two_device_link() {
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  XPIPE_NCCL_CHECK(ncclCommInitAll(comms, 2, devs));
  const std::vector<index_t> rows{4, 4, 3};
  std::thread producer([&] {
    XPIPE_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t s;
    XPIPE_CUDA_CHECK(cudaStreamCreate(&s));
    NcclLink<> out(2, 4, 8);
    out.connect({comms[0], true, false, 1, s, {}, {}});
    for (int g = 0; g < 3; ++g) {
      while (!out.can_push()) {
      }
      MicroBatchMessage& m = out.back();
      std::vector<float> h(static_cast<std::size_t>(rows[g] * 8));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = 100.f * g + static_cast<float>(i);
      XPIPE_CUDA_CHECK(cudaMemcpy(m.data.data, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
      XPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // landed before the link's stream reads
      m.micro_batch = g;
      m.data.rows = rows[g];
      out.push();
    }
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
  });
  XPIPE_CUDA_CHECK(cudaSetDevice(1));
  cudaStream_t s;
  XPIPE_CUDA_CHECK(cudaStreamCreate(&s));
  NcclLink<> in(2, 4, 8);
  in.connect({comms[1], false, true, 0, s, {0, 1, 2}, rows});
  for (int g = 0; g < 3; ++g) {
    while (!in.can_pop()) {
    }
    const MicroBatchMessage& m = in.front();
    check(m.micro_batch == g && m.data.rows == rows[g], "the message is not the one expected");
    std::vector<float> h(static_cast<std::size_t>(m.data.rows * 8));
    XPIPE_CUDA_CHECK(cudaMemcpy(h.data(), m.data.data, h.size() * 4, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < h.size(); ++i)
      if (h[i] != 100.f * g + static_cast<float>(i)) {
        check(false, "a float arrived changed");
        break;
      }
    in.pop();
  }
  producer.join();
  ncclCommDestroy(comms[0]);
  ncclCommDestroy(comms[1]);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf(
        "skipped: no CUDA device here (NcclLink is built by nvcc; it runs where a GPU is)\n");
    return 77;
  }
  try {
    one_rank_all_reduce();
    if (devices >= 2)
      two_device_link();
    else
      std::printf("one device: the two-device link check needs two GPUs, not run\n");
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures == 0 ? "nccl ok" : "nccl FAILED");
  return failures == 0 ? 0 : 1;
}
