// The hf backend's linear layers for the few rows of a decode step (compiled_linear.py), float32 or bfloat16.
//
// A decode step multiplies a few dozen rows by every weight of the model, so the weights stream from memory once
// a step and the product is as fast as that stream. The weight is packed once into panels of one vector's width
// of output features, laid out k by k ([panels, steps, one vector]), so a tile of panels reads straight through
// memory while each loaded vector meets every row of the tile; the next lines are prefetched a few kilobytes ahead.
// In float32 a step is one k: a vector of `width` weights, each row's value broadcast and multiplied in. In
// bfloat16 (built only where the CPU has AVX-512 BF16) a step is a pair of k: a vector holds `width` outputs' two
// weights side by side, and vdpbf16ps multiplies them with the row's pair and adds both products to float32 sums:
// half the bytes of float32 per weight and half the instructions. Each output is rounded to bfloat16 once, at the end.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// A product's number format: what a packed weight and a row's value for one step are, how a step multiplies a
// vector of weights into the sums, and how the sums are written out.
struct Float32 {
  using Weight = float;
  using Input = float;   // one row's value of one k
  using Output = float;
  static constexpr int64_t kDepth = 1;  // k a step takes
  static Reg weights(const Weight* w) { return load(w); }
  static Reg broadcast(Input x) { return splat(x); }
  static Reg multiply_add(Reg x, Reg w, Reg acc) { return fma(x, w, acc); }
  static void write(Output* y, Reg sums) { store(y, sums); }
  static Input pack(const float* x, int64_t in, int64_t k) { return x[k]; }
};

#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
constexpr bool kBFloat16 = true;
struct BFloat16 {
  using Weight = at::BFloat16;
  using Input = uint32_t;  // one row's values of k and k + 1, as vdpbf16ps takes them
  using Output = at::BFloat16;
  static constexpr int64_t kDepth = 2;
  static Reg weights(const Weight* w) { return _mm512_castsi512_ps(_mm512_loadu_si512(w)); }
  static Reg broadcast(Input x) { return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(x))); }
  static Reg multiply_add(Reg x, Reg w, Reg acc) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
  static void write(Output* y, Reg sums) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(sums));
  }
  static Input pack(const at::BFloat16* x, int64_t in, int64_t k) {
    uint16_t pair[2] = {x[k].x, k + 1 < in ? x[k + 1].x : uint16_t(0)};
    uint32_t out;
    std::memcpy(&out, pair, sizeof(out));
    return out;
  }
};
#else
constexpr bool kBFloat16 = false;
#endif
// Panels multiplied by every row block while they sit in the L2 cache: 12, or 6 where 12 would pass a quarter of
// a 1 MB L2 (room for the next group too: SmolLM2's wider layers, 576 and 1,536 inputs).
constexpr int64_t GROUP = 12;
constexpr int64_t GROUP_BYTES = 256 << 10;
constexpr int64_t AHEAD = 4096;  // bytes ahead in each panel; 1 KB gained little, 8 KB less than 4 KB

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

// y[i, j * width + c] for ROWS rows and PANELS panels: sums over the steps s of xt[s * ROWS + i] times panel j's
// vector of step s, from bias. `steps` is in / kDepth, rounded up.
template <typename F, int ROWS, int PANELS>
void tile(const typename F::Input* xt, const typename F::Weight* panels, const float* bias, int64_t steps,
          typename F::Output* y, int64_t ldy, int64_t columns, NextGroup& next) {
  constexpr int64_t kStep = kWidth * F::kDepth;  // weights a panel holds per step: one vector
  const char* line = next.line;
  Reg acc[ROWS][PANELS];
  for (int j = 0; j < PANELS; ++j) {
    const Reg b = load(bias + j * kWidth);
    for (int i = 0; i < ROWS; ++i) acc[i][j] = b;
  }
  for (int64_t k = 0; k < steps; ++k) {
    Reg w[PANELS];
    for (int j = 0; j < PANELS; ++j) {
      const typename F::Weight* at = panels + (j * steps + k) * kStep;
      w[j] = F::weights(at);
      __builtin_prefetch(reinterpret_cast<const char*>(at) + AHEAD);
    }
    for (int64_t l = 0; l < next.per_step && line < next.end; ++l, line += 64) _mm_prefetch(line, _MM_HINT_T2);
    for (int i = 0; i < ROWS; ++i) {
      const Reg x = F::broadcast(xt[k * ROWS + i]);
      for (int j = 0; j < PANELS; ++j) acc[i][j] = F::multiply_add(x, w[j], acc[i][j]);
    }
  }
  next.line = line;
  if (columns >= PANELS * kWidth) {
    for (int i = 0; i < ROWS; ++i)
      for (int j = 0; j < PANELS; ++j) F::write(y + i * ldy + j * kWidth, acc[i][j]);
    return;
  }
  typename F::Output last[ROWS][PANELS * kWidth];  // the last panel holds padding: copy out only its real columns
  for (int i = 0; i < ROWS; ++i)
    for (int j = 0; j < PANELS; ++j) F::write(last[i] + j * kWidth, acc[i][j]);
  for (int i = 0; i < ROWS; ++i) std::copy(last[i], last[i] + columns, y + i * ldy);
}

// ROWS rows (transposed in xt) times panels [first, last), PANELS at a time.
template <typename F, int ROWS, int PANELS>
void row_block(const typename F::Input* xt, const typename F::Weight* packed, const float* bias, int64_t steps,
               int64_t first, int64_t last, typename F::Output* y, int64_t out, NextGroup& next) {
  constexpr int64_t kStep = kWidth * F::kDepth;
  int64_t p = first;
  for (; p + PANELS <= last; p += PANELS)
    tile<F, ROWS, PANELS>(xt, packed + p * steps * kStep, bias + p * kWidth, steps, y + p * kWidth, out,
                          out - p * kWidth, next);
  for (; p < last; ++p)
    tile<F, ROWS, 1>(xt, packed + p * steps * kStep, bias + p * kWidth, steps, y + p * kWidth, out, out - p * kWidth,
                     next);
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
template <typename F, int ROWS = 1>
void multiply(int64_t rows, const typename F::Input* xt, const typename F::Weight* packed, const float* bias,
              int64_t steps, int64_t first, int64_t last, typename F::Output* y, int64_t out, NextGroup& next) {
  if constexpr (ROWS < kMaxRows) {
    if (rows != ROWS) return multiply<F, ROWS + 1>(rows, xt, packed, bias, steps, first, last, y, out, next);
  }
  row_block<F, ROWS, panels_for(ROWS)>(xt, packed, bias, steps, first, last, y, out, next);
}

// Panels [first, last) are the group being multiplied (each `panel_bytes` long): which of the next group's lines
// to prefetch, how fast.
NextGroup next_group(const char* packed, int64_t panel_bytes, int64_t steps, int64_t first, int64_t last,
                     int64_t panels, const std::vector<std::pair<int64_t, int64_t>>& blocks) {
  const int64_t next_last = std::min(panels, 2 * last - first);
  int64_t tile_steps = 0;  // steps of every tile over this group (row_block: full tiles, then one panel at a time)
  for (const auto& block : blocks) {
    const int64_t width = panels_for(block.second);
    tile_steps += ((last - first) / width + (last - first) % width) * steps;
  }
  const int64_t lines = (next_last - last) * panel_bytes / 64;
  return {packed + last * panel_bytes, packed + next_last * panel_bytes,
          blocks.size() > 1 ? (lines + tile_steps - 1) / tile_steps : 0};
}

// x [rows, in] @ weight.T + bias in format F, with the weight packed by pack_weight ([panels, steps, one vector]).
template <typename F>
void product(const torch::Tensor& x, const torch::Tensor& packed, const float* bias, torch::Tensor& y) {
  constexpr int64_t kStep = kWidth * F::kDepth;
  const int64_t rows = x.size(0), in = x.size(1), out = y.size(1), panels = packed.size(0), steps = packed.size(1);
  // Each row block transposed once ([steps, block rows]): a tile then reads one step's rows from one cache line.
  const auto blocks = split_rows(rows);
  std::vector<typename F::Input> xt(rows * steps);
  const auto* xp = x.data_ptr<typename F::Output>();
  for (const auto& [m, size] : blocks)
    for (int64_t k = 0; k < steps; ++k)
      for (int64_t i = 0; i < size; ++i) xt[m * steps + k * size + i] = F::pack(xp + (m + i) * in, in, k * F::kDepth);
  const auto* w = reinterpret_cast<const typename F::Weight*>(packed.data_ptr());
  auto* yp = y.data_ptr<typename F::Output>();
  const int64_t panel_bytes = steps * kStep * int64_t(sizeof(typename F::Weight));
  const int64_t group = GROUP * panel_bytes > GROUP_BYTES ? GROUP / 2 : GROUP;
  const int64_t groups = (panels + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * group, last = std::min(panels, first + group);
      NextGroup next = next_group(reinterpret_cast<const char*>(w), panel_bytes, steps, first, last, panels, blocks);
      for (const auto& [m, size] : blocks)
        multiply<F>(size, xt.data() + m * steps, w, bias, steps, first, last, yp + m * out, out, next);
    }
  });
}

// k a step takes in `dtype`: 1 in float32, 2 in bfloat16 (a pair).
int64_t depth(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || (dtype == at::kBFloat16 && kBFloat16),
              kBFloat16 ? "float32 or bfloat16" : "float32 (this build has no bfloat16: no AVX-512 BF16)");
  return dtype == at::kFloat ? 1 : 2;
}

}  // namespace

// weight [out, in] -> packed [ceil(out / width), ceil(in / depth), width * depth] (allocated by the caller, same
// dtype), the last panel and an odd last k padded with zeros: in bfloat16 a vector holds each output's pair of k.
void pack_weight(const torch::Tensor& weight, torch::Tensor& packed) {
  TORCH_CHECK(weight.dim() == 2 && weight.device().is_cpu(), "a CPU matrix");
  const int64_t d = depth(weight.scalar_type());
  const int64_t out = weight.size(0), in = weight.size(1), panels = (out + kWidth - 1) / kWidth;
  const int64_t steps = (in + d - 1) / d;
  TORCH_CHECK(packed.is_contiguous() && packed.scalar_type() == weight.scalar_type() &&
                  packed.sizes() == at::IntArrayRef({panels, steps, kWidth * d}),
              "packed: [", panels, ", ", steps, ", ", kWidth * d, "] of the weight's dtype");
  auto padded = torch::zeros({panels * kWidth, steps * d}, weight.options());
  padded.narrow(0, 0, out).narrow(1, 0, in).copy_(weight);
  packed.view({panels, steps, kWidth, d}).copy_(padded.view({panels, kWidth, steps, d}).transpose(1, 2));
}

// x [rows, in] @ weight.T + bias, with weight packed by pack_weight and bias (float32) padded to the panels' width;
// the result in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias, int64_t out) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == packed.scalar_type(),
              "x: CPU rows of the weight's dtype");
  const int64_t d = depth(x.scalar_type());
  const int64_t in = x.size(1), panels = packed.size(0);
  TORCH_CHECK(packed.is_contiguous() && packed.size(1) == (in + d - 1) / d && packed.size(2) == kWidth * d &&
                  (out + kWidth - 1) / kWidth == panels && bias.is_contiguous() &&
                  bias.scalar_type() == at::kFloat && bias.numel() == panels * kWidth,
              "weight and bias must come from pack_weight for ", in, " inputs and ", out, " outputs");
  auto y = torch::empty({x.size(0), out}, x.options());
  const auto xc = x.contiguous();
  const float* b = bias.data_ptr<float>();
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if (d == 2) {
    product<BFloat16>(xc, packed, b, y);
    return y;
  }
#endif
  product<Float32>(xc, packed, b, y);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("width") = kWidth;
  m.attr("bfloat16") = kBFloat16;
  m.def("pack_weight", &pack_weight);
  m.def("linear", &linear);
}
