// Registration of kiln's own kernels (runtime/cpu/).
#include "runtime/kernel.h"

namespace kiln {

namespace cpu {
void register_norm(KernelRegistry& r);
void register_dwconv(KernelRegistry& r);
void register_pointwise_depthwise(KernelRegistry& r);
void register_direct_conv(KernelRegistry& r);
void register_winograd(KernelRegistry& r);
void register_pool(KernelRegistry& r);
void register_activation(KernelRegistry& r);
void register_movement(KernelRegistry& r);
void register_softmax(KernelRegistry& r);
void register_gemm(KernelRegistry& r);
void register_attention(KernelRegistry& r);
void register_binary(KernelRegistry& r);
void register_quant(KernelRegistry& r);
void register_qmatmul(KernelRegistry& r);
void register_qdwconv(KernelRegistry& r);
void register_qconv_direct(KernelRegistry& r);
void register_woq_matmul(KernelRegistry& r);
}  // namespace cpu

void register_cpu_kernels(KernelRegistry& r) {
  cpu::register_norm(r);
  cpu::register_dwconv(r);
  cpu::register_pointwise_depthwise(r);
  cpu::register_direct_conv(r);
  cpu::register_winograd(r);
  cpu::register_pool(r);
  cpu::register_activation(r);
  cpu::register_movement(r);
  cpu::register_softmax(r);
  cpu::register_gemm(r);
  cpu::register_attention(r);
  cpu::register_binary(r);
  cpu::register_quant(r);
  cpu::register_qmatmul(r);
  cpu::register_qdwconv(r);
  cpu::register_qconv_direct(r);
  cpu::register_woq_matmul(r);
}

}  // namespace kiln
