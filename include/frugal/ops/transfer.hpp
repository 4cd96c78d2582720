#pragma once
// Transfers between the device arena and the slower tiers, as graph nodes the
// budget planner inserts. Each transfer is two nodes: a start, which hands
// the copy to the copy engine and returns at once, and a done, which waits
// for it. Compute scheduled between the two overlaps the copy. The done node
// reads what the copy reads and writes, so liveness keeps both ends of the
// copy in place until it has finished.
//
//   evict:      start(v) -> h (a host or NVMe copy);  done(v, h)
//   fetch:      start(h) -> d (an arena buffer);      done(d, h) -> d' (a view of d, which readers use)
//   write back: start(d, p) copies a staged persistent back to its home p;  done(d, p)
//
// A fetch may also read a parameter or optimizer state directly (its home on
// the host), and a write back returns it there after its update.
#include "checks.hpp"

namespace frugal::ops {

using frugal::TransferKind;  // declared in graph/op.hpp, beside TransferOp

class Transfer final : public TransferOp {
 public:
  ~Transfer() override;
  // `slot` pairs a start with its done; the copy engine keeps one event per slot.
  Transfer(TransferKind kind, int slot, std::string what) : TransferOp(kind, slot, std::move(what)) {}
  std::string name() const override {
    switch (kind()) {
      case TransferKind::evict_start: return "evict";
      case TransferKind::evict_done: return "evict.done";
      case TransferKind::fetch_start: return "fetch";
      case TransferKind::fetch_done: return "fetch.done";
      case TransferKind::write_back_start: return "write_back";
      case TransferKind::write_back_done: return "write_back.done";
    }
    return "transfer";
  }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    switch (kind()) {
      case TransferKind::evict_start:
        expect_arity(name(), in, 1);
        return {in[0]};
      case TransferKind::fetch_start:
        expect_arity(name(), in, 1);
        return {in[0]};
      case TransferKind::fetch_done:
        expect_arity(name(), in, 2);
        return {in[0]};
      case TransferKind::evict_done:
      case TransferKind::write_back_start:
      case TransferKind::write_back_done:
        expect_arity(name(), in, 2);
        if (in[0].nbytes() != in[1].nbytes())
          fail<ShapeError>(name(), ": copies ", in[0].str(), " to ", in[1].str(), ", which differ in size");
        return {};
    }
    return {};
  }
  // The done of a fetch names the fetched buffer under a new id.
  bool is_view() const override { return kind() == TransferKind::fetch_done; }
  std::vector<int> mutated_inputs() const override {
    if (kind() == TransferKind::write_back_start || kind() == TransferKind::write_back_done) return {1};
    return {};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    return {0, is_start() ? double(in[0].nbytes()) : 0.0};
  }
};

}  // namespace frugal::ops
