#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): concat,
// split, slices, gathers and scatters, embeddings and dropout.
#include "../dropout.hpp"
#include "../embedding.hpp"
#include "../indexing.hpp"
#include "../register.hpp"

namespace frugal::cpu {

void add_indexing_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::Concat>(concat_kernel);
  t.add<ops::Split>(split_kernel);
  t.add<ops::Slice>(slice_kernel);
  t.add<ops::SliceGrad>(slice_grad_kernel);
  t.add<ops::IndexSelect>(index_select_kernel);
  t.add<ops::IndexAdd>(index_add_kernel);
  t.add<ops::Gather>(gather_kernel);
  t.add<ops::ScatterAdd>(scatter_add_kernel);
  t.add<ops::Embedding>(embedding_kernel);
  t.add<ops::EmbeddingGrad>(embedding_grad_kernel, embedding_grad_workspace);
  t.add<ops::Dropout>([](const ops::Dropout& op, const KernelArgs& a) { dropout_kernel(op, a); });
  t.add<ops::DropoutGrad>([](const ops::DropoutGrad& op, const KernelArgs& a) { dropout_kernel(op, a); });
}

}  // namespace frugal::cpu
