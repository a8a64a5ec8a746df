// The hf backend's linear layers for the few rows of a decode step (compiled_linear.py).
//
// A decode step multiplies a few dozen rows by every weight of the model, so the weights stream from memory once
// a step and the product is as fast as that stream. The weight is packed once into panels of one vector's width
// of output features, laid out k by k ([panels, in_features, width]), so a tile of panels reads straight through
// memory while each loaded vector meets every row of the tile; the next lines are prefetched a few kilobytes ahead.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// One vector register of floats at the width torch dispatches to here (cpu_kernels.py sets the macros). Raw
// intrinsics rather than ATen's Vectorized: GCC 12 kept arrays of Vectorized sums in memory (1.8x slower).
#if defined(CPU_CAPABILITY_AVX512)
using Reg = __m512;
inline Reg load(const float* p) { return _mm512_loadu_ps(p); }
inline Reg splat(float x) { return _mm512_set1_ps(x); }
inline Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
inline void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
#elif defined(CPU_CAPABILITY_AVX2)
using Reg = __m256;
inline Reg load(const float* p) { return _mm256_loadu_ps(p); }
inline Reg splat(float x) { return _mm256_set1_ps(x); }
inline Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
inline void store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
#else
using Reg = float;
inline Reg load(const float* p) { return *p; }
inline Reg splat(float x) { return x; }
inline Reg fma(Reg a, Reg b, Reg c) { return std::fma(a, b, c); }
inline void store(float* p, Reg x) { *p = x; }
#endif
constexpr int64_t kWidth = sizeof(Reg) / sizeof(float);
// Panels multiplied by every row block while they sit in the L2 cache: 12, or 6 where 12 would pass half of a
// 1 MB L2 (SmolLM2's down projection, 1,536 inputs; 1-3% faster over its layers than 12 everywhere).
constexpr int64_t GROUP = 12;
constexpr int64_t GROUP_BYTES = 512 << 10;
constexpr int64_t AHEAD = 1024;  // floats (4 KB) ahead in each panel; 256 gained little, 2,048 less than 1,024

// y[i, j * width + c] for ROWS rows and PANELS panels: sums over k of xt[k * ROWS + i] * panel_j[k, c], from bias.
template <int ROWS, int PANELS>
void tile(const float* xt, const float* panels, const float* bias, int64_t in, float* y, int64_t ldy,
          int64_t columns) {
  Reg acc[ROWS][PANELS];
  for (int j = 0; j < PANELS; ++j) {
    const Reg b = load(bias + j * kWidth);
    for (int i = 0; i < ROWS; ++i) acc[i][j] = b;
  }
  for (int64_t k = 0; k < in; ++k) {
    Reg w[PANELS];
    for (int j = 0; j < PANELS; ++j) {
      const float* at = panels + (j * in + k) * kWidth;
      w[j] = load(at);
      __builtin_prefetch(at + AHEAD);
    }
    for (int i = 0; i < ROWS; ++i) {
      const Reg x = splat(xt[k * ROWS + i]);
      for (int j = 0; j < PANELS; ++j) acc[i][j] = fma(x, w[j], acc[i][j]);
    }
  }
  if (columns >= PANELS * kWidth) {
    for (int i = 0; i < ROWS; ++i)
      for (int j = 0; j < PANELS; ++j) store(y + i * ldy + j * kWidth, acc[i][j]);
    return;
  }
  float last[ROWS][PANELS * kWidth];  // the last panel holds padding: copy out only its real columns
  for (int i = 0; i < ROWS; ++i)
    for (int j = 0; j < PANELS; ++j) store(last[i] + j * kWidth, acc[i][j]);
  for (int i = 0; i < ROWS; ++i) std::copy(last[i], last[i] + columns, y + i * ldy);
}

// ROWS rows (transposed in xt) times panels [first, last), PANELS at a time.
template <int ROWS, int PANELS>
void row_block(const float* xt, const float* packed, const float* bias, int64_t in, int64_t first, int64_t last,
               float* y, int64_t out) {
  int64_t p = first;
  for (; p + PANELS <= last; p += PANELS)
    tile<ROWS, PANELS>(xt, packed + p * in * kWidth, bias + p * kWidth, in, y + p * kWidth, out, out - p * kWidth);
  for (; p < last; ++p)
    tile<ROWS, 1>(xt, packed + p * in * kWidth, bias + p * kWidth, in, y + p * kWidth, out, out - p * kWidth);
}

// Row blocks sized so ROWS * PANELS sums and PANELS weight vectors fit the vector registers (32 with AVX-512,
// 16 otherwise); one thread, SmolLM2's layers: 16 rows 1.3x oneDNN's prepacked product, 64 rows 1.05x.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kBlocks[] = {12, 8, 4, 2, 1};
#else
constexpr int64_t kBlocks[] = {6, 4, 2, 1};
#endif

int64_t block_rows(int64_t left) {
  for (int64_t rows : kBlocks)
    if (left >= rows) return rows;
  return 1;
}

void multiply(int64_t rows, const float* xt, const float* packed, const float* bias, int64_t in, int64_t first,
              int64_t last, float* y, int64_t out) {
  switch (rows) {
#if defined(CPU_CAPABILITY_AVX512)
    case 12: return row_block<12, 2>(xt, packed, bias, in, first, last, y, out);
    case 8: return row_block<8, 3>(xt, packed, bias, in, first, last, y, out);
    case 4: return row_block<4, 6>(xt, packed, bias, in, first, last, y, out);
    case 2: return row_block<2, 8>(xt, packed, bias, in, first, last, y, out);
    default: return row_block<1, 8>(xt, packed, bias, in, first, last, y, out);
#else
    case 6: return row_block<6, 2>(xt, packed, bias, in, first, last, y, out);
    case 4: return row_block<4, 3>(xt, packed, bias, in, first, last, y, out);
    case 2: return row_block<2, 6>(xt, packed, bias, in, first, last, y, out);
    default: return row_block<1, 6>(xt, packed, bias, in, first, last, y, out);
#endif
  }
}

}  // namespace

// weight [out, in] -> [ceil(out / width), in, width], the last panel padded with zeros.
torch::Tensor pack_weight(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.device().is_cpu() && weight.scalar_type() == at::kFloat,
              "a float32 CPU matrix");
  const int64_t out = weight.size(0), in = weight.size(1), panels = (out + kWidth - 1) / kWidth;
  auto padded = torch::zeros({panels * kWidth, in}, weight.options());
  padded.narrow(0, 0, out).copy_(weight);
  return padded.view({panels, kWidth, in}).transpose(1, 2).contiguous();
}

// x [rows, in] @ weight.T + bias, with weight packed by pack_weight and bias padded to the panels' width.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias, int64_t out) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == at::kFloat, "x: float32 CPU rows");
  const int64_t rows = x.size(0), in = x.size(1), panels = packed.size(0);
  TORCH_CHECK(packed.is_contiguous() && packed.size(1) == in && packed.size(2) == kWidth &&
                  (out + kWidth - 1) / kWidth == panels && bias.is_contiguous() && bias.numel() == panels * kWidth,
              "weight and bias must come from pack_weight for ", in, " inputs and ", out, " outputs");
  auto y = torch::empty({rows, out}, x.options());
  // Each row block transposed once ([in, block rows]): a tile then reads one k's rows from one cache line.
  const auto xc = x.contiguous();
  std::vector<float> xt(rows * in);
  const float* xp = xc.data_ptr<float>();
  for (int64_t m = 0, size; m < rows; m += size) {
    size = block_rows(rows - m);
    for (int64_t k = 0; k < in; ++k)
      for (int64_t i = 0; i < size; ++i) xt[m * in + k * size + i] = xp[(m + i) * in + k];
  }
  const float* w = packed.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t group = GROUP * in * kWidth * sizeof(float) > GROUP_BYTES ? GROUP / 2 : GROUP;
  const int64_t groups = (panels + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * group, last = std::min(panels, first + group);
      for (int64_t m = 0, size; m < rows; m += size) {
        size = block_rows(rows - m);
        multiply(size, xt.data() + m * in, w, b, in, first, last, yp + m * out, out);
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_weight", &pack_weight);
  m.def("linear", &linear);
}
