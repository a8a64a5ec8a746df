// The attention of a packed step's decode rows, read straight from the paged KV pool (decode_attention.py).
//
// One task per (row, KV head): the row's query heads of that group score every position the row may read,
// softmax, then sum the values, each key and value read once from its pool slot. torch's operators need a
// gathered copy of the rows' keys and values first and a batched product per row and head.
//
// The query heads of a group are handled together, up to MAX_HEADS at a time, with their sums held in vector
// registers: each key or value loaded is used by every head of the group before the next one is read.
//
// The pool holds float32 or bfloat16 (the model's dtype); the query, the scores, the softmax and the sums are
// float32 either way, each bfloat16 key and value widened as it is loaded.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kVec = Vec::size();
constexpr int MAX_HEADS = 8;

// Keys and values sit in blocks scattered over the pool, where the hardware's prefetcher loses the stream at each
// block's end: the scores ask for a position's key and value lines AHEAD positions before they are read (the
// values are read after the softmax, from the cache). 16 ran 2.8x faster than none at 64 rows of 200 positions on
// SmolLM2's shapes; 2 and 4 were slower than none.
constexpr int64_t AHEAD = 16;

template <typename T>
void prefetch(const T* key, const T* value, int64_t dim) {
  for (int64_t i = 0; i < dim; i += 64 / sizeof(T)) {
    __builtin_prefetch(key + i);
    __builtin_prefetch(value + i);
  }
}

// `count` (at most a vector's) pool values from p as float32.
inline Vec widen(const float* p, int64_t count = kVec) { return count == kVec ? Vec::loadu(p) : Vec::loadu(p, count); }
inline Vec widen(const c10::BFloat16* p, int64_t count = kVec) {
  if (count == kVec) {
    Vec out;
    at::vec::load_to_float<c10::BFloat16>(p, out);
    return out;
  }
  float part[kVec] = {};
  for (int64_t i = 0; i < count; ++i) part[i] = static_cast<float>(p[i]);
  return Vec::loadu(part);
}

float sum_lanes(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

// scores[p * n + j] = factor * (query head p) . (key j), for HEADS heads at once.
template <int HEADS, typename T>
void score(const float* q, int64_t q_head, const T* keys, const T* values, const int64_t* where, int64_t n,
           int64_t dim, float factor, float* scores) {
  const int64_t full = dim / kVec * kVec, tail = dim - full;
  for (int64_t j = 0; j < n; ++j) {
    const T* k = keys + where[j];
    if (j + AHEAD < n) prefetch(keys + where[j + AHEAD], values + where[j + AHEAD], dim);
    Vec acc[HEADS];
    for (int p = 0; p < HEADS; ++p) acc[p] = Vec(0.0f);
    for (int64_t i = 0; i < full; i += kVec) {
      const Vec kv = widen(k + i);
      for (int p = 0; p < HEADS; ++p) acc[p] = at::vec::fmadd(Vec::loadu(q + p * q_head + i), kv, acc[p]);
    }
    if (tail) {
      const Vec kv = widen(k + full, tail);
      for (int p = 0; p < HEADS; ++p) acc[p] = at::vec::fmadd(Vec::loadu(q + p * q_head + full, tail), kv, acc[p]);
    }
    for (int p = 0; p < HEADS; ++p) scores[p * n + j] = sum_lanes(acc[p]) * factor;
  }
}

// out[p * dim + i] = sum_j weights[p * n + j] * value_j[i] for the WIDTH vectors of dimensions from `from`.
template <int HEADS, int WIDTH, typename T>
void weigh(const float* weights, const T* values, const int64_t* where, int64_t n, int64_t from, int64_t dim,
           float* out) {
  int64_t count[WIDTH];
  for (int c = 0; c < WIDTH; ++c) count[c] = std::min(kVec, dim - from - c * kVec);
  Vec acc[HEADS][WIDTH];
  for (int p = 0; p < HEADS; ++p)
    for (int c = 0; c < WIDTH; ++c) acc[p][c] = Vec(0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const T* v = values + where[j] + from;
    Vec vv[WIDTH];
    for (int c = 0; c < WIDTH; ++c) vv[c] = widen(v + c * kVec, count[c]);
    for (int p = 0; p < HEADS; ++p) {
      const Vec w(weights[p * n + j]);
      for (int c = 0; c < WIDTH; ++c) acc[p][c] = at::vec::fmadd(w, vv[c], acc[p][c]);
    }
  }
  for (int p = 0; p < HEADS; ++p)
    for (int c = 0; c < WIDTH; ++c) acc[p][c].store(out + p * dim + from + c * kVec, count[c]);
}

// softmax in place over s[0:n], with torch's accurate exp (Sleef's, within one ulp) where the CPU has vectors.
void softmax(float* s, int64_t n) {
  const float top = at::vec::reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, s, n);
  at::vec::map([top](Vec x) { return (x - Vec(top)).exp(); }, s, s, n);
  const float total = at::vec::reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, s, n);
  at::vec::map([total](Vec x) { return x / Vec(total); }, s, s, n);
}

// HEADS query heads (of one KV head) attend over n positions; scores is scratch of HEADS * n.
template <int HEADS, typename T>
void attend(const float* q, int64_t q_head, const T* keys, const T* values, const int64_t* where, int64_t n,
            int64_t dim, float factor, float* scores, float* out) {
  score<HEADS, T>(q, q_head, keys, values, where, n, dim, factor, scores);
  for (int p = 0; p < HEADS; ++p) softmax(scores + p * n, n);
  // Two vectors of dimensions at a time keep 2 * HEADS sums in flight, enough to hide the multiply-add latency.
  int64_t from = 0;
  for (; from + kVec < dim; from += 2 * kVec) weigh<HEADS, 2, T>(scores, values, where, n, from, dim, out);
  if (from < dim) weigh<HEADS, 1, T>(scores, values, where, n, from, dim, out);
}

template <typename T>
using Attend = void (*)(const float*, int64_t, const T*, const T*, const int64_t*, int64_t, int64_t, float, float*,
                        float*);
template <typename T>
constexpr Attend<T> kAttend[MAX_HEADS] = {attend<1, T>, attend<2, T>, attend<3, T>, attend<4, T>,
                                          attend<5, T>, attend<6, T>, attend<7, T>, attend<8, T>};


// Every row's query heads attend over the positions its table lists (see decode_attention).
template <typename T>
void attend_rows(const float* q, int64_t q_row, int64_t q_head, const T* k, const T* v, const int64_t* table,
                 int64_t t_row, const int64_t* length, int64_t l_row, int64_t rows, int64_t heads, int64_t groups,
                 int64_t slots, int64_t dim, int64_t block_size, float factor, float* o) {
  const int64_t per = heads / groups;
  at::parallel_for(0, rows * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;   // [heads at a time, n]: the scores, then the weights
    std::vector<int64_t> where;  // [n]: where each position's key and value start in the layer's pool
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / groups, g = task % groups, n = length[r * l_row];
      scores.resize(std::min<int64_t>(per, MAX_HEADS) * n);
      where.resize(n);
      // block by block: a division per position cost a tenth of the kernel's time with the pool in cache
      for (int64_t j = 0, b = 0; j < n; ++b) {
        const int64_t start = (g * slots + table[r * t_row + b] * block_size) * dim;
        for (int64_t o = 0; o < block_size && j < n; ++o, ++j) where[j] = start + o * dim;
      }
      for (int64_t p = 0; p < per; p += MAX_HEADS) {
        const int64_t head = g * per + p;
        kAttend<T>[std::min<int64_t>(per - p, MAX_HEADS) - 1](q + r * q_row + head * q_head, q_head, k, v,
                                                              where.data(), n, dim, factor, scores.data(),
                                                              o + (r * heads + head) * dim);
      }
    }
  });
}

}  // namespace

// query [rows, heads, dim] float32 (any row and head strides); keys, values [kv_heads, slots, dim], float32 or
// bfloat16; tables [rows, blocks] block ids; lengths [rows]: how many leading positions each row reads. Returns
// [rows, heads, dim] float32.
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& tables, const torch::Tensor& lengths, int64_t block_size,
                               double scale) {
  TORCH_CHECK(query.device().is_cpu() && query.scalar_type() == at::kFloat, "query: float32 on the CPU");
  for (const auto* t : {&keys, &values})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == keys.scalar_type() &&
                    (t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16),
                "keys and values: float32 or bfloat16 on the CPU");
  TORCH_CHECK(query.stride(2) == 1 && keys.is_contiguous() && values.is_contiguous(), "unexpected layout");
  TORCH_CHECK(tables.scalar_type() == at::kLong && lengths.scalar_type() == at::kLong && tables.stride(1) == 1,
              "tables and lengths: int64");
  const int64_t rows = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t groups = keys.size(0), slots = keys.size(1);
  auto out = torch::empty({rows, heads, dim}, query.options());
  const int64_t* table = tables.data_ptr<int64_t>();
  const int64_t* length = lengths.data_ptr<int64_t>();
  const int64_t t_row = tables.stride(0), l_row = lengths.stride(0);
  // Every slot a row reads must lie in the pool: a bad table would read foreign memory, not fail.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = length[r * l_row];
    TORCH_CHECK(n >= 1 && n <= tables.size(1) * block_size, "row ", r, " reads ", n, " positions");
    for (int64_t b = 0; b * block_size < n; ++b)
      TORCH_CHECK(table[r * t_row + b] >= 0 && (table[r * t_row + b] + 1) * block_size <= slots, "row ", r,
                  " block ", table[r * t_row + b], " lies outside the pool");
  }
  const auto run = [&](const auto* k, const auto* v) {
    attend_rows(query.data_ptr<float>(), query.stride(0), query.stride(1), k, v, table, t_row, length, l_row, rows,
                heads, groups, slots, dim, block_size, static_cast<float>(scale), out.data_ptr<float>());
  };
  if (keys.scalar_type() == at::kFloat)
    run(keys.data_ptr<float>(), values.data_ptr<float>());
  else
    run(keys.data_ptr<c10::BFloat16>(), values.data_ptr<c10::BFloat16>());
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode_attention", &decode_attention); }
