#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// the Graph members every captured op goes through.
#include "../graph.hpp"
#include "../var.hpp"

namespace frugal {

ValueId Graph::add_persistent(const Tensor& storage, ValueKind kind, std::string name) {
  if (!storage.defined()) fail("parameter '", name, "' has no storage (was it registered before it was created?)");
  if (!is_persistent(kind))
    fail("'", name, "': only parameters, optimizer state, buffers and constants are bound to tensors the user owns; a ",
         value_kind_name(kind), " is declared with input<T>(shape) or produced by an op");
  auto it = by_storage_.find(storage.raw());
  if (it != by_storage_.end()) return it->second;
  if (kind == ValueKind::parameter && parameter_source_) {
    // The source may add values of its own (the shard it gathers from) and
    // call back here for them; it answers kNoValue for those.
    auto source = std::move(parameter_source_);
    const ValueId from = source(*this, storage, name);
    parameter_source_ = std::move(source);
    if (from != kNoValue) {
      by_storage_[storage.raw()] = from;
      return from;
    }
  }
  ValueId id = add_value({.meta = {storage.dtype(), storage.shape()},
                          .kind = kind,
                          .name = std::move(name),
                          .external = storage});
  by_storage_[storage.raw()] = id;
  return id;
}

std::vector<ValueId> Graph::apply_impl(std::shared_ptr<const Op> op, std::vector<ValueId> inputs,
                                       const std::vector<NodeId>* after) {
  std::vector<TensorMeta> in;
  in.reserve(inputs.size());
  for (ValueId v : inputs) in.push_back(value(v).meta);
  std::vector<TensorMeta> out_meta = op->infer(in);
  NodeId nid = NodeId(nodes_.size());
  Node node{std::move(op), std::move(inputs), {}, {}, phase_};
  for (auto& m : out_meta) {
    node.outputs.push_back(add_value({.meta = m, .kind = ValueKind::activation, .producer = nid}));
  }
  node.inplace = queries_.inplace_inputs ? queries_.inplace_inputs(*node.op) : node.op->inplace_inputs();
  std::size_t ws = queries_.workspace_bytes ? queries_.workspace_bytes(*node.op, in, out_meta) : 0;
  if (ws > 0) {
    node.outputs.push_back(add_value({.meta = {DType::u8, Shape{std::int64_t(ws)}},
                                      .kind = ValueKind::activation,
                                      .producer = nid,
                                      .is_workspace = true}));
    node.has_workspace = true;
  }
  for (int mi : node.op->mutated_inputs())
    if (const Value& target = value(node.inputs[std::size_t(mi)]); target.kind == ValueKind::constant)
      fail(node.op->name(), " writes '", target.name, "', which is a constant: a constant is read by every step and ",
           "written by none (bind it as a parameter, or as a module buffer, if an op must update it)");
  if (after) {
    node.after = *after;
  } else {
    for (int mi : node.op->mutated_inputs()) {
      ValueId target = node.inputs[std::size_t(mi)];
      for (NodeId reader : consumers(target))
        if (reader != nid) node.after.push_back(reader);
    }
  }
  nodes_.push_back(std::move(node));
  for (ValueId v : nodes_.back().inputs) add_reader(v, nid);
  auto r = nodes_.back().results();
  return {r.begin(), r.end()};
}

}  // namespace frugal
