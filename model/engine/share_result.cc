#include "model/engine/share_result.h"

#include "runtime/transport.h"

namespace shardlab::engine {

void share_device_rows(const std::vector<int>& owners,
                       const std::function<void(wire::Writer&, size_t)>& put,
                       const std::function<void(wire::Reader&, size_t)>& get) {
  Transport* t = process_transport();
  if (!t) return;
  wire::Writer w;
  for (size_t d = 0; d < owners.size(); ++d) {
    if (owners[d] != t->process()) continue;
    w.put<uint64_t>(d);
    put(w, d);
  }
  for (const std::string& s : t->exchange(w.str())) {
    wire::Reader in(s);
    while (in.left() > 0) {
      const auto d = size_t(in.get<uint64_t>());
      get(in, d);
    }
  }
}

void share_from_process(int owner, const std::function<void(wire::Writer&)>& put,
                        const std::function<void(wire::Reader&)>& get) {
  Transport* t = process_transport();
  if (!t) return;
  wire::Writer w;
  if (t->process() == owner) put(w);
  const std::string theirs =
      t->exchange(t->process() == owner ? w.str() : std::string())[size_t(owner)];
  wire::Reader in(theirs);
  get(in);
}

}  // namespace shardlab::engine
