// Whether this test binary is built with ThreadSanitizer, which runs the
// emulator 10-15x slower: a heavy test may pick a smaller case there (and
// says so), keeping the full case in every other build.
#pragma once

namespace shardlab::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

}  // namespace shardlab::testing
