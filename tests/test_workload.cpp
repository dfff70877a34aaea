// Tests of prepack/workload.hpp: the profiles' lengths stay in their documented ranges and are
// the same for the same seed; the record reader takes any integer below its limit, however many
// digits, and names the file, line and text of anything else.
#include "support/workload.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

std::vector<support::record> read(const std::string& text, long long limit) {
  std::istringstream in(text);
  return support::read_records(in, "f.txt", "token id", limit);
}

TEST(Workload, ProfilesStayInRangeAndRepeat) {
  for (support::profile p : support::all_profiles()) {
    const auto a = support::generate_lengths(p, 500, 3, 256);
    EXPECT_EQ(a, support::generate_lengths(p, 500, 3, 256));
    if (p != support::profile::equal) {
      EXPECT_NE(a, support::generate_lengths(p, 500, 4, 256)) << support::profile_name(p);
    }
    const int hi = p == support::profile::heavy ? 4 * 256 : 256;
    for (int l : a) {
      ASSERT_GE(l, 4);
      ASSERT_LE(l, hi);
    }
    EXPECT_EQ(support::parse_profile(support::profile_name(p)), p);
  }
}

TEST(Workload, RecordsOfAnyNumberOfDigitsBelowTheLimit) {
  const long long max = 9223372036854775807LL;  // 2^63 - 1, 19 digits
  const auto r = read("1 2,3\n# comment\n\n9223372036854775806 0000000000000000000000042\n", max);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].values, (std::vector<long long>{1, 2, 3}));
  EXPECT_EQ(r[1].line, 4u);
  EXPECT_EQ(r[1].values, (std::vector<long long>{9223372036854775806LL, 42}));
  EXPECT_PREPACK_ERROR(read("9223372036854775807\n", max),
                       "f.txt:1: token id 9223372036854775807 is not below 9223372036854775807");
  EXPECT_PREPACK_ERROR(read("5\n99999999999999999999999\n", max),
                       "f.txt:2: token id 99999999999999999999999 is not below");
  EXPECT_PREPACK_ERROR(read("1 x7\n", 10), "f.txt:1: token id 'x7' is not a non-negative integer");
  EXPECT_PREPACK_ERROR(read("1 -3\n", 10), "'-3' is not a non-negative integer");
  EXPECT_PREPACK_ERROR(read("12\n", 10), "f.txt:1: token id 12 is not below 10");
  EXPECT_PREPACK_ERROR(read("# nothing\n", 10), "f.txt: no records");
}

}  // namespace
