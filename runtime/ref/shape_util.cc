// The strided copy behind the shape family's layout kernels.
#include "runtime/ref/shape_util.h"

namespace kiln::ref_shape {

namespace {

// The innermost run: n elements at stride s (in elements) into contiguous dst.
template <class T>
void copy_run(T* dst, const T* src, int64_t n, int64_t s) {
  if (s == 0) {
    T v = *src;
    for (int64_t i = 0; i < n; ++i) dst[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * s];
  }
}

void run(char* dst, const char* src, size_t elem, int64_t n, int64_t s) {
  if (s == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * elem);
    return;
  }
  switch (elem) {
    case 1: copy_run(reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(src), n, s); break;
    case 2: copy_run(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(src), n, s); break;
    case 4: copy_run(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(src), n, s); break;
    case 8: copy_run(reinterpret_cast<uint64_t*>(dst), reinterpret_cast<const uint64_t*>(src), n, s); break;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + static_cast<size_t>(i) * elem, src + i * s * static_cast<int64_t>(elem), elem);
  }
}

}  // namespace

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

void copy_strided(void* dst, const void* src, size_t elem, std::vector<int64_t> shape, std::vector<int64_t> strides,
                  int64_t offset) {
  // Drop size-1 dims and merge neighbours that are contiguous in the source too, so a
  // transpose that keeps the last dims together copies long rows.
  std::vector<int64_t> sh, st;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return;
    if (shape[i] == 1) continue;
    if (!sh.empty() && st.back() == strides[i] * shape[i]) {
      sh.back() *= shape[i];
      st.back() = strides[i];
    } else {
      sh.push_back(shape[i]);
      st.push_back(strides[i]);
    }
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src) + offset * static_cast<int64_t>(elem);
  if (sh.empty()) {
    std::memcpy(d, s, elem);
    return;
  }
  const size_t r = sh.size();
  const int64_t n = sh[r - 1], inner_stride = st[r - 1];
  const size_t row_bytes = static_cast<size_t>(n) * elem;
  std::vector<int64_t> idx(r, 0);
  int64_t src_off = 0;  // in elements, for the current outer index
  while (true) {
    run(d, s + src_off * static_cast<int64_t>(elem), elem, n, inner_stride);
    d += row_bytes;
    size_t a = r - 1;
    while (a-- > 0) {
      src_off += st[a];
      if (++idx[a] < sh[a]) break;
      src_off -= st[a] * sh[a];
      idx[a] = 0;
    }
    if (a == static_cast<size_t>(-1)) return;
  }
}

}  // namespace kiln::ref_shape
