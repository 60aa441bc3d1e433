#include "models/experiment.hpp"

#include "models/schedules/schedule.hpp"

namespace dtsim {

// The spellings returned here are the ones experiment files use (models/experiment_io.cpp
// parses them back), so a report can be fed back as input.

const char* to_string(Activation a) {
  switch (a) {
    case Activation::gelu: return "gelu";
    case Activation::swiglu: return "swiglu";
  }
  return "?";
}

const char* to_string(Norm n) {
  switch (n) {
    case Norm::layernorm: return "layernorm";
    case Norm::rmsnorm: return "rmsnorm";
  }
  return "?";
}

const char* to_string(Position p) {
  switch (p) {
    case Position::learned: return "learned";
    case Position::rope: return "rope";
  }
  return "?";
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

const char* to_string(MemoryQuantity q) {
  switch (q) {
    case MemoryQuantity::model_states: return "model_states";
    case MemoryQuantity::activations: return "activations";
    case MemoryQuantity::peak: return "peak";
  }
  return "?";
}

const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "bf16";
    case Dtype::fp8: return "fp8";
    case Dtype::fp4: return "fp4";
  }
  return "?";
}

const char* to_string(IntraNode n) {
  switch (n) {
    case IntraNode::nvswitch: return "nvswitch";
    case IntraNode::xgmi_mesh: return "xgmi-mesh";
  }
  return "?";
}

const char* to_string(Framework f) {
  switch (f) {
    case Framework::megatron: return "megatron";
    case Framework::deepspeed: return "deepspeed";
    case Framework::zero_paper: return "zero-paper";
    case Framework::fsdp: return "fsdp";
  }
  return "?";
}

const char* to_string(CudaGraphs g) {
  switch (g) {
    case CudaGraphs::none: return "none";
    case CudaGraphs::layers: return "layers";
    case CudaGraphs::full_iteration: return "full_iteration";
  }
  return "?";
}

const char* to_string(Schedule s) { return sched::schedule_of(s).name(); }

const char* to_string(GradDtype g) {
  switch (g) {
    case GradDtype::fp32: return "fp32";
    case GradDtype::bf16: return "bf16";
  }
  return "?";
}

const char* to_string(RouterScore r) {
  switch (r) {
    case RouterScore::softmax: return "softmax";
    case RouterScore::sigmoid: return "sigmoid";
  }
  return "?";
}

const char* to_string(RouterBalance b) {
  switch (b) {
    case RouterBalance::forced: return "forced";
    case RouterBalance::measured: return "measured";
    case RouterBalance::aux_loss: return "aux_loss";
    case RouterBalance::aux_free: return "aux_free";
  }
  return "?";
}

}  // namespace dtsim
