// How context parallelism exchanges keys and values (--cp-comm): the ring of
// point-to-point transfers or an all-gather (cp_attention.h). Apart from
// CpAttention so that the trainer's options need not include it.
#pragma once

#include <string>

namespace shardlab::parallel {

enum class CpComm { kRing, kAllGather };
CpComm parse_cp_comm(const std::string& text);  // ConfigError on anything else
const char* cp_comm_name(CpComm c);

}  // namespace shardlab::parallel
