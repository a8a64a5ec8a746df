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
// Panels multiplied by every row block while they sit in the L2 cache: 12, or 6 where 12 would pass a quarter of
// a 1 MB L2 (room for the next group too: SmolLM2's wider layers, 576 and 1,536 inputs).
constexpr int64_t GROUP = 12;
constexpr int64_t GROUP_BYTES = 256 << 10;
constexpr int64_t AHEAD = 1024;  // floats (4 KB) ahead in each panel; 256 gained little, 2,048 less than 1,024

// The next group's lines still to bring into the L2 cache, a few each k step. With more rows than one block
// holds, the first row block reads the group from memory and the later ones from the L2 cache, so the memory
// would idle in the later blocks and stall the first: spreading the next group's reads over every block keeps
// it busy (SmolLM2's linear layers alone, one thread: 16 rows 4% faster, 40 rows 6%; in its whole decode step
// within noise at 16 rows, 2-3% at 40 and 64). Off when one block reads the group: the in-panel prefetch alone
// streams faster there.
struct NextGroup {
  const char* line;
  const char* end;
  int64_t per_step;
};

// y[i, j * width + c] for ROWS rows and PANELS panels: sums over k of xt[k * ROWS + i] * panel_j[k, c], from bias.
template <int ROWS, int PANELS>
void tile(const float* xt, const float* panels, const float* bias, int64_t in, float* y, int64_t ldy,
          int64_t columns, NextGroup& next) {
  const char* line = next.line;
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
    for (int64_t l = 0; l < next.per_step && line < next.end; ++l, line += 64) _mm_prefetch(line, _MM_HINT_T2);
    for (int i = 0; i < ROWS; ++i) {
      const Reg x = splat(xt[k * ROWS + i]);
      for (int j = 0; j < PANELS; ++j) acc[i][j] = fma(x, w[j], acc[i][j]);
    }
  }
  next.line = line;
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
               float* y, int64_t out, NextGroup& next) {
  int64_t p = first;
  for (; p + PANELS <= last; p += PANELS)
    tile<ROWS, PANELS>(xt, packed + p * in * kWidth, bias + p * kWidth, in, y + p * kWidth, out, out - p * kWidth,
                       next);
  for (; p < last; ++p)
    tile<ROWS, 1>(xt, packed + p * in * kWidth, bias + p * kWidth, in, y + p * kWidth, out, out - p * kWidth, next);
}

// A row block holds ROWS * PANELS sums, PANELS weight vectors and one broadcast row value in the vector registers.
// Every count of rows up to kMaxRows is one block, multiplied in one pass over each panel group: a pass reads the
// group again (from the L2 cache after the first), and blocks of fixed sizes (12, 8, 4, 2, 1) cost SmolLM2's
// products, one thread, 25 ms a step at 3 rows (2 + 1), 31 ms at 7 (4 + 2 + 1), where one block takes 15-17 ms.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kRegisters = 32;
#else
constexpr int kRegisters = 16;
#endif

// Panels a block takes at a time, as measured there: one up to 4 rows, where the product waits on memory and one
// stream per tile reads fastest (1-4 rows 14-15 ms; 15-18 ms with 2, 3 or 6 panels), two above (5-14 rows
// 17-19 ms; one panel a tile took 31 ms at 5 and 6 rows, three were slower at 4, 6 and 16 rows, no faster at 8).
constexpr int panels_for(int64_t rows) { return rows <= 4 ? 1 : 2; }

// The largest block that fits with two panels: 14 rows with AVX-512, 6 otherwise.
constexpr int64_t kMaxRows = (kRegisters - 3) / 2;

// The rows split into as few blocks as fit, of sizes that differ by one at most: (first row, rows) each.
std::vector<std::pair<int64_t, int64_t>> split_rows(int64_t rows) {
  const int64_t count = (rows + kMaxRows - 1) / kMaxRows, base = rows / count, extra = rows % count;
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t b = 0, m = 0; b < count; m += blocks.back().second, ++b) blocks.emplace_back(m, base + (b < extra));
  return blocks;
}

// A block of `rows` rows times panels [first, last).
template <int ROWS = 1>
void multiply(int64_t rows, const float* xt, const float* packed, const float* bias, int64_t in, int64_t first,
              int64_t last, float* y, int64_t out, NextGroup& next) {
  if constexpr (ROWS < kMaxRows) {
    if (rows != ROWS) return multiply<ROWS + 1>(rows, xt, packed, bias, in, first, last, y, out, next);
  }
  row_block<ROWS, panels_for(ROWS)>(xt, packed, bias, in, first, last, y, out, next);
}

// Panels [first, last) are the group being multiplied: which of the next group's lines to prefetch, how fast.
NextGroup next_group(const float* packed, int64_t in, int64_t first, int64_t last, int64_t panels,
                     const std::vector<std::pair<int64_t, int64_t>>& blocks) {
  const int64_t next_last = std::min(panels, 2 * last - first);
  int64_t steps = 0;  // k steps of every tile over this group (row_block: full tiles, then one panel at a time)
  for (const auto& block : blocks) {
    const int64_t width = panels_for(block.second);
    steps += ((last - first) / width + (last - first) % width) * in;
  }
  const int64_t lines = (next_last - last) * in * kWidth * int64_t(sizeof(float)) / 64;
  const auto at = [&](int64_t panel) { return reinterpret_cast<const char*>(packed + panel * in * kWidth); };
  return {at(last), at(next_last), blocks.size() > 1 ? (lines + steps - 1) / steps : 0};
}

}  // namespace

// weight [out, in] -> packed [ceil(out / width), in, width] (allocated by the caller), the last panel padded with
// zeros.
void pack_weight(const torch::Tensor& weight, torch::Tensor& packed) {
  TORCH_CHECK(weight.dim() == 2 && weight.device().is_cpu() && weight.scalar_type() == at::kFloat,
              "a float32 CPU matrix");
  const int64_t out = weight.size(0), in = weight.size(1), panels = (out + kWidth - 1) / kWidth;
  TORCH_CHECK(packed.is_contiguous() && packed.scalar_type() == at::kFloat &&
                  packed.sizes() == at::IntArrayRef({panels, in, kWidth}),
              "packed: float32 [", panels, ", ", in, ", ", kWidth, "]");
  auto padded = torch::zeros({panels * kWidth, in}, weight.options());
  padded.narrow(0, 0, out).copy_(weight);
  packed.copy_(padded.view({panels, kWidth, in}).transpose(1, 2));
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
  const auto blocks = split_rows(rows);
  std::vector<float> xt(rows * in);
  const float* xp = xc.data_ptr<float>();
  for (const auto& [m, size] : blocks)
    for (int64_t k = 0; k < in; ++k)
      for (int64_t i = 0; i < size; ++i) xt[m * in + k * size + i] = xp[(m + i) * in + k];
  const float* w = packed.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t group = GROUP * in * kWidth * sizeof(float) > GROUP_BYTES ? GROUP / 2 : GROUP;
  const int64_t groups = (panels + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * group, last = std::min(panels, first + group);
      NextGroup next = next_group(w, in, first, last, panels, blocks);
      for (const auto& [m, size] : blocks)
        multiply(size, xt.data() + m * in, w, b, in, first, last, yp + m * out, out, next);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("width") = kWidth;
  m.def("pack_weight", &pack_weight);
  m.def("linear", &linear);
}
