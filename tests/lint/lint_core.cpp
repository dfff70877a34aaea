// A driver that instantiates every std-only public template, so clang-tidy (.clang-tidy, run by
// .ci/run) sees their bodies; also built and run as a test.
#include <prepack/engines.hpp>
#include <prepack/prepack.hpp>
#include "support/workload.hpp"

#include <cstdint>
#include <vector>

int main() {
  const std::vector<int> len{5, 3, 2};
  const auto p = prepack::first_fit_decreasing(len);
  const auto bp = prepack::best_fit_decreasing(len);
  const auto fp = prepack::fitted_plan(prepack::packer::best_fit_decreasing, len, {0.0, 12});
  const auto l = prepack::make_layout(p, std::vector<int>(10, 1));
  const auto m = prepack::dense_mask(l);
  const auto a = prepack::additive_mask(l);
  const auto v = prepack::make_varlen(l);
  const auto t = prepack::make_token_batch(l);
  const auto bsm = prepack::make_block_sparse_mask(l, 2, 3);
  const auto lps = prepack::left_padded_slots(l, 5);
  const auto ps = prepack::prompt_slots(l, 2);
  std::vector<float> src(l.n_slots());
  const auto s = prepack::packed_view<const float>(src.data(), prepack::kv_order::row_slot_head_dim,
                                                   l.n_rows(), l.width(), 1, 1);
  const auto c = prepack::unpack_contiguous(l, s);
  std::vector<float> pool(100);
  const std::vector<int> bt{0, 1, 2, 3, 4, 5};
  prepack::unpack_paged(l, s, prepack::contiguous_view<float, 4>(pool.data(), {10, 10, 1, 1}),
                        prepack::contiguous_view<const int, 2>(bt.data(), {3, 2}));
  const auto sm = prepack::make_slot_mapping(
      l, prepack::contiguous_view<const int, 2>(bt.data(), {3, 2}), 10, 10);
  const auto flat = prepack::flatten_rows(s);
  prepack::write_slots(
      sm, flat,
      prepack::paged_view(pool.data(), prepack::paged_order::block_head_dim_slot, 10, 10, 1, 1));
  std::vector<prepack::half> key(100);
  prepack::write_slots(sm, flat, prepack::split_key_view(key.data(), 10, 10, 1, 1, 1));
  std::vector<float> lp(30);
  prepack::unpack_left_padded(l, s, prepack::contiguous_view<float, 4>(lp.data(), {3, 10, 1, 1}));
  std::vector<float> g(3);
  prepack::gather_last(l, prepack::contiguous_view<const float, 2>(src.data(), {l.n_slots(), 1}),
                       prepack::contiguous_view<float, 2>(g.data(), {3, 1}));
  const auto sp = prepack::split_rows(p, 1);
  const auto lb = prepack::length_sorted_batches(prepack::span<const int>(len), 2);
  const auto w = support::generate_lengths(support::profile::heavy, 10, 1);
  const std::vector<int> toks{1, 2, 3};
  const std::vector<std::int32_t> row{1};
  const prepack::scheduled_sequence<int> seq{
      7, 0, prepack::span<const int>(toks), prepack::span<const std::int32_t>(row), 3, true, false};
  const auto in = prepack::make_sequence_inputs(
      prepack::span<const prepack::scheduled_sequence<int>>(&seq, 1), 4, 2);
  prepack::vllm::options v1;
  v1.model_runner = prepack::vllm::runner::v1;
  const auto vf = prepack::vllm::make_step(in, v1);
  const auto vs = prepack::vllm::make_step(in);
  const bool sane = vf.req_order == vs.req_order && m.size() == a.size() &&
                    v.slot.size() == t.pos.size() && c.size() == 3 && sp.size() == p.n_rows() &&
                    lb.size() == 2 && w.size() == 10 && bp.n_rows() == p.n_rows() &&
                    fp.slots() == 10 && bsm.n_blocks == 3 && lps.size() == 15 && ps.size() == 6;
  return sane ? 0 : 1;
}
