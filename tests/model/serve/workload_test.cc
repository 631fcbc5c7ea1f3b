#include "model/serve/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/errors.h"
#include "support/config_error.h"

namespace shardlab::serve {
namespace {

TEST(ServeWorkload, BurstArrivesAtOnceWithConstantLengths) {
  const auto w = make_workload(5, parse_arrival("burst"), parse_length_dist("128", "--prompt-len"),
                               parse_length_dist("7", "--output-len"), 1);
  ASSERT_EQ(w.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(w[size_t(i)].id, i);
    EXPECT_EQ(w[size_t(i)].arrival_s, 0.0);
    EXPECT_EQ(w[size_t(i)].prompt_len, 128);
    EXPECT_EQ(w[size_t(i)].output_len, 7);
  }
}

// Exponential gaps of rate λ: mean 1/λ, and a coefficient of variation of 1.
// Over 20000 gaps the sample mean's standard error is 0.7%: tolerance 3%.
TEST(ServeWorkload, PoissonGapsHaveTheRatesMean) {
  const int n = 20001;
  const auto w = make_workload(n, parse_arrival("poisson:4"), parse_length_dist("1", "p"),
                               parse_length_dist("1", "o"), 7);
  double sum = 0, sq = 0;
  for (int i = 1; i < n; ++i) {
    const double gap = w[size_t(i)].arrival_s - w[size_t(i - 1)].arrival_s;
    ASSERT_GE(gap, 0);
    sum += gap;
    sq += gap * gap;
  }
  const double mean = sum / (n - 1), sd = std::sqrt(sq / (n - 1) - mean * mean);
  std::printf("poisson:4 mean gap %.5f s (expect 0.25), sd %.5f (expect 0.25)\n", mean, sd);
  EXPECT_NEAR(mean, 0.25, 0.03 * 0.25);
  EXPECT_NEAR(sd, 0.25, 0.03 * 0.25);
}

TEST(ServeWorkload, UniformCoversItsBoundsOnly) {
  const auto w = make_workload(4000, parse_arrival("burst"), parse_length_dist("uniform:3:6", "p"),
                               parse_length_dist("uniform:1:1", "o"), 3);
  std::array<int, 4> seen{};
  for (const Request& r : w) {
    ASSERT_GE(r.prompt_len, 3);
    ASSERT_LE(r.prompt_len, 6);
    ++seen[size_t(r.prompt_len - 3)];
    EXPECT_EQ(r.output_len, 1);
  }
  for (int c : seen) EXPECT_NEAR(c, 1000, 100);  // 1000 each; sd about 27
}

// exp(N(ln m, σ)) has median m; clamped to [1, MAX].
TEST(ServeWorkload, LognormalHasItsMedianAndALongClampedTail) {
  const auto w = make_workload(10001, parse_arrival("burst"), parse_length_dist("lognormal:200:1:1000", "p"),
                               parse_length_dist("1", "o"), 5);
  std::vector<int> v;
  for (const Request& r : w) v.push_back(r.prompt_len);
  std::sort(v.begin(), v.end());
  std::printf("lognormal:200:1:1000 median %d, max %d, min %d\n", v[v.size() / 2], v.back(), v.front());
  EXPECT_NEAR(v[v.size() / 2], 200, 10);
  EXPECT_EQ(v.back(), 1000);  // P(X > 1000) = 5.4%: the clamp is reached
  EXPECT_GE(v.front(), 1);
}

TEST(ServeWorkload, SameSeedSameRequestsOtherSeedOthers) {
  const auto a = make_workload(50, parse_arrival("poisson:2"), parse_length_dist("uniform:1:100", "p"),
                               parse_length_dist("uniform:1:100", "o"), 11);
  const auto b = make_workload(50, parse_arrival("poisson:2"), parse_length_dist("uniform:1:100", "p"),
                               parse_length_dist("uniform:1:100", "o"), 11);
  const auto c = make_workload(50, parse_arrival("poisson:2"), parse_length_dist("uniform:1:100", "p"),
                               parse_length_dist("uniform:1:100", "o"), 12);
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_len, b[i].prompt_len);
    differ += a[i].prompt_len != c[i].prompt_len;
  }
  EXPECT_GT(differ, 40);
}

TEST(ServeWorkload, BadSpecsAreOneLineConfigErrors) {
  for (const char* bad : {"0", "-3", "1.5", "abc", "", "uniform:5", "uniform:9:3", "uniform:0:3",
                          "lognormal:100", "lognormal:100:-1", "lognormal:100:nan", "lognormal:0:1",
                          "zipf:3", "uniform:1:2:3", "99999999999"}) {
    const std::string e = testing::config_error_of([&] { parse_length_dist(bad, "--prompt-len"); });
    EXPECT_NE(e.find("--prompt-len"), std::string::npos) << bad << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  for (const char* bad : {"poisson", "poisson:0", "poisson:-1", "poisson:inf", "poisson:x", "gamma:2", ""}) {
    const std::string e = testing::config_error_of([&] { parse_arrival(bad); });
    EXPECT_NE(e.find("`arrival`"), std::string::npos) << bad << ": " << e;
  }
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ServeWorkload, TraceFileRowsAreRequests) {
  const auto w = load_trace(write_file("serve_trace.csv", "arrival_s,prompt_len,output_len\n0,10,2\n0.5,3,1\r\n\n2.25,7,9\n"));
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].arrival_s, 0.5);
  EXPECT_EQ(w[2].prompt_len, 7);
  EXPECT_EQ(w[2].output_len, 9);
  EXPECT_EQ(w[2].id, 2);
}

TEST(ServeWorkload, TraceFileRowsMayCarryPromptTokens) {
  const auto w = load_trace(write_file("serve_trace_ids.csv",
                                       "arrival_s,prompt_len,output_len,prompt_tokens\n0,3,2,5 6 7\n0.5,1,4, 9 \n"));
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].prompt, (std::vector<model::Token>{5, 6, 7}));
  EXPECT_EQ(w[1].prompt, (std::vector<model::Token>{9}));
  EXPECT_EQ(w[1].output_len, 4);
}

TEST(ServeWorkload, BadTraceFilesNameTheLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"time,p,o\n0,1,1\n", "line 1"},
      {"arrival_s,prompt_len,output_len\n0,1\n", "line 2"},
      {"arrival_s,prompt_len,output_len\n1,1,1\n0.5,1,1\n", "line 3"},
      {"arrival_s,prompt_len,output_len\n0,0,1\n", "line 2"},
      {"arrival_s,prompt_len,output_len\n-1,4,1\n", "line 2"},
      {"arrival_s,prompt_len,output_len\n", "no requests"},
      {"arrival_s,prompt_len,output_len,prompt_tokens\n0,2,1,5\n", "prompt_len says 2"},
      {"arrival_s,prompt_len,output_len,prompt_tokens\n0,2,1,5 x\n", "line 2"},
      {"arrival_s,prompt_len,output_len,prompt_tokens\n0,2,1,5 -1\n", "not a token id"},
      {"arrival_s,prompt_len,output_len,prompt_tokens\n0,2,1\n", "4 comma-separated"},
      {"arrival_s,prompt_len,output_len\n0,2,1,5 6\n", "3 comma-separated"},
  };
  for (const auto& [text, want] : cases) {
    const std::string e = testing::config_error_of([&] { load_trace(write_file("bad_trace.csv", text)); });
    EXPECT_NE(e.find(want), std::string::npos) << text << " -> " << e;
  }
  EXPECT_NE(testing::config_error_of([] { load_trace("/nonexistent/x.csv"); }).find("no such file"),
            std::string::npos);
}

}  // namespace
}  // namespace shardlab::serve
