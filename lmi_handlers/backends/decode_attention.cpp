// The attention of a packed step's decode rows, read straight from the paged KV pool (decode_attention.py).
//
// One task per (row, KV head): the row's query heads of that group score every position the row may read,
// softmax, then sum the values, each key and value read once from its pool slot. torch's operators need a
// gathered copy of the rows' keys and values first and a batched product per row and head.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

float dot(const float* a, const float* b, int64_t n) {
  Vec sum(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) sum = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), sum);
  if (i < n) sum = at::vec::fmadd(Vec::loadu(a + i, n - i), Vec::loadu(b + i, n - i), sum);
  return at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
}

// out[0:n] += weight * x[0:n]
void add_scaled(float* out, float weight, const float* x, int64_t n) {
  const Vec w(weight);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size())
    at::vec::fmadd(w, Vec::loadu(x + i), Vec::loadu(out + i)).store(out + i);
  if (i < n) at::vec::fmadd(w, Vec::loadu(x + i, n - i), Vec::loadu(out + i, n - i)).store(out + i, n - i);
}

// s[0:n] = softmax(s[0:n]), with torch's accurate exp (Sleef's, within one ulp) where the CPU has vectors.
void softmax(float* s, int64_t n) {
  const float top = at::vec::reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, s, n);
  at::vec::map([top](Vec x) { return (x - Vec(top)).exp(); }, s, s, n);
  const float total = at::vec::reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, s, n);
  at::vec::map([total](Vec x) { return x / Vec(total); }, s, s, n);
}

}  // namespace

// query [rows, heads, dim] (any row and head strides); keys, values [kv_heads, slots, dim]; tables [rows, blocks]
// block ids; lengths [rows]: how many leading positions each row reads. Returns [rows, heads, dim].
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& tables, const torch::Tensor& lengths, int64_t block_size,
                               double scale) {
  for (const auto* t : {&query, &keys, &values})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat, "float32 CPU tensors only");
  TORCH_CHECK(query.stride(2) == 1 && keys.is_contiguous() && values.is_contiguous(), "unexpected layout");
  TORCH_CHECK(tables.scalar_type() == at::kLong && lengths.scalar_type() == at::kLong && tables.stride(1) == 1,
              "tables and lengths: int64");
  const int64_t rows = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t groups = keys.size(0), slots = keys.size(1), per = heads / groups;
  auto out = torch::zeros({rows, heads, dim}, query.options());
  const float* q = query.data_ptr<float>();
  const float* k = keys.data_ptr<float>();
  const float* v = values.data_ptr<float>();
  const int64_t* table = tables.data_ptr<int64_t>();
  const int64_t* length = lengths.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const int64_t q_row = query.stride(0), q_head = query.stride(1), t_row = tables.stride(0), l_row = lengths.stride(0);
  const float factor = static_cast<float>(scale);
  // Every slot a row reads must lie in the pool: a bad table would read foreign memory, not fail.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = length[r * l_row];
    TORCH_CHECK(n >= 1 && n <= tables.size(1) * block_size, "row ", r, " reads ", n, " positions");
    for (int64_t b = 0; b * block_size < n; ++b)
      TORCH_CHECK(table[r * t_row + b] >= 0 && (table[r * t_row + b] + 1) * block_size <= slots, "row ", r,
                  " block ", table[r * t_row + b], " lies outside the pool");
  }
  at::parallel_for(0, rows * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;   // [per, n]: a query head's scores, then its weights
    std::vector<int64_t> where;  // [n]: where each position's key and value start in the layer's pool
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / groups, g = task % groups, n = length[r * l_row];
      scores.resize(per * n);
      where.resize(n);
      for (int64_t j = 0; j < n; ++j)
        where[j] = (g * slots + table[r * t_row + j / block_size] * block_size + j % block_size) * dim;
      const float* qg = q + r * q_row + g * per * q_head;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < per; ++p) scores[p * n + j] = dot(qg + p * q_head, k + where[j], dim) * factor;
      for (int64_t p = 0; p < per; ++p) softmax(scores.data() + p * n, n);
      float* og = o + (r * heads + g * per) * dim;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < per; ++p) add_scaled(og + p * dim, scores[p * n + j], v + where[j], dim);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode_attention", &decode_attention); }
