/*
 * One valid message of every Envelope case, for the proto tests and for the
 * seed corpus of tests/fuzz/fuzz_frame.c. Everything lives in the caller's
 * sample_t; nothing is allocated.
 */
#ifndef CAP_PROTO_SAMPLES_H
#define CAP_PROTO_SAMPLES_H

#include <string.h>

#include "capuchin/frame.h"

#define SAMPLE_COUNT 14 /* Envelope cases 1..14 */

typedef struct sample {
  Capuchin__Envelope env;
  Capuchin__Hello hello;
  Capuchin__Welcome welcome;
  Capuchin__TensorDecl decl;
  Capuchin__OpRecord op, batch_op0, batch_op1;
  Capuchin__OpRecord *batch_ops[2];
  Capuchin__AccessBatch batch;
  Capuchin__Free free_;
  Capuchin__IterationEnd iter_end;
  Capuchin__PrefetchStall stall0, stall1;
  Capuchin__PrefetchStall *stalls[2];
  Capuchin__Feedback feedback;
  Capuchin__PlanAction act0, act1, act2;
  Capuchin__PlanAction *acts[3];
  Capuchin__Plan plan;
  Capuchin__PlanAck ack;
  Capuchin__Error error;
  Capuchin__Bye bye;
  Capuchin__BudgetUpdate budget;
  Capuchin__BudgetAck budget_ack;
  uint32_t op_in[3], op_out[1], b0_in[2], b0_out[1], b1_out[2];
  char *names[2];
  uint32_t c_seq[3], c_name[3], c_n_in[3], c_n_out[3], c_tensors[7];
  int64_t c_start[3], c_end[3];
  uint32_t d_id[3];
  uint64_t d_bytes[3];
  Capuchin__TensorKind d_kind[3];
  int64_t f_t[2];
  uint32_t f_tensor[2];
  uint32_t rec_ops[3];
} sample_t;

/* Fill s with a valid envelope of case `which` (1..SAMPLE_COUNT). */
static inline void sample_fill(sample_t *s, int which) {
  memset(s, 0, sizeof *s);
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  s->env = env;
  switch (which) {
  case CAPUCHIN__ENVELOPE__MSG_HELLO: {
    Capuchin__Hello m = CAPUCHIN__HELLO__INIT;
    m.has_protocol_version = 1, m.protocol_version = CAP_PROTO_VERSION;
    m.job_name = "resnet50-train";
    m.has_pid = 1, m.pid = 4242;
    m.has_device_index = 1, m.device_index = 0;
    m.device_name = "NVIDIA H100 80GB HBM3";
    m.has_device_total_bytes = 1, m.device_total_bytes = 85899345920ull;
    m.has_budget_bytes = 1, m.budget_bytes = 3ull << 30;
    m.has_h2d_gbps = 1, m.h2d_gbps = 55.1;
    m.has_d2h_gbps = 1, m.d2h_gbps = 55.1;
    m.has_duplex_gbps = 1, m.duplex_gbps = 85.8;
    m.backend = "cuda";
    m.has_model_signature = 1, m.model_signature = 0x9e3779b97f4a7c15ull;
    m.has_persistent_bytes = 1, m.persistent_bytes = 205520896;
    m.device_uuid = "GPU-6a0f3c2e-5b1d-4e8f-9a7c-3d2b1e0f4a5c";
    m.has_acks_budget = 1, m.acks_budget = 1;
    s->hello = m;
    s->env.hello = &s->hello;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_WELCOME: {
    Capuchin__Welcome m = CAPUCHIN__WELCOME__INIT;
    m.has_protocol_version = 1, m.protocol_version = CAP_PROTO_VERSION;
    m.has_session_id = 1, m.session_id = 7;
    m.has_job_id = 1, m.job_id = 3;
    m.has_budget_bytes = 1, m.budget_bytes = 2ull << 30;
    m.has_plan_reused = 1, m.plan_reused = 1;
    m.has_wants_budget_ack = 1, m.wants_budget_ack = 1;
    s->welcome = m;
    s->env.welcome = &s->welcome;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_TENSOR_DECL: {
    Capuchin__TensorDecl m = CAPUCHIN__TENSOR_DECL__INIT;
    m.has_id = 1, m.id = 1038;
    m.has_bytes = 1, m.bytes = 51380224;
    m.has_kind = 1, m.kind = CAPUCHIN__TENSOR_KIND__TENSOR_KIND_ACTIVATION;
    s->decl = m;
    s->env.tensor_decl = &s->decl;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_OP_RECORD: {
    Capuchin__OpRecord m = CAPUCHIN__OP_RECORD__INIT;
    m.has_seq = 1, m.seq = 17;
    m.has_start_ns = 1, m.start_ns = 1200345;
    m.has_end_ns = 1, m.end_ns = 1300001;
    m.name = "aten.convolution.default";
    s->op_in[0] = 5, s->op_in[1] = 6, s->op_in[2] = 2147483647u;
    s->op_out[0] = 40;
    m.n_inputs = 3, m.inputs = s->op_in;
    m.n_outputs = 1, m.outputs = s->op_out;
    s->op = m;
    s->env.op_record = &s->op;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH: {
    Capuchin__AccessBatch m = CAPUCHIN__ACCESS_BATCH__INIT;
    Capuchin__OpRecord r = CAPUCHIN__OP_RECORD__INIT;
    m.has_iteration = 1, m.iteration = 1;
    r.has_seq = 1, r.seq = 0;
    r.has_start_ns = 1, r.start_ns = 0;
    r.has_end_ns = 1, r.end_ns = 10;
    r.name = "aten.relu_.default";
    s->b0_in[0] = 1, s->b0_in[1] = 2, s->b0_out[0] = 1;
    r.n_inputs = 2, r.inputs = s->b0_in;
    r.n_outputs = 1, r.outputs = s->b0_out;
    s->batch_op0 = r;
    r.seq = 1, r.start_ns = 10, r.end_ns = 25, r.name = "aten.view.default";
    r.n_inputs = 0, r.inputs = NULL;
    s->b1_out[0] = 3, s->b1_out[1] = 4;
    r.n_outputs = 2, r.outputs = s->b1_out;
    s->batch_op1 = r;
    s->batch_ops[0] = &s->batch_op0, s->batch_ops[1] = &s->batch_op1;
    m.n_ops = 2, m.ops = s->batch_ops;
    s->names[0] = "aten.addmm.default", s->names[1] = "aten.t.default";
    m.n_names = 2, m.names = s->names;
    for (int i = 0; i < 3; i++) {
      s->c_seq[i] = 2 + (uint32_t)i;
      s->c_start[i] = 30 + 10 * i;
      s->c_end[i] = 35 + 10 * i;
      s->c_name[i] = (uint32_t)i % 2;
    }
    s->c_n_in[0] = 3, s->c_n_out[0] = 1; /* addmm */
    s->c_n_in[1] = 1, s->c_n_out[1] = 1; /* t */
    s->c_n_in[2] = 0, s->c_n_out[2] = 1;
    uint32_t t[7] = {4, 5, 6, 7, 7, 8, 9};
    memcpy(s->c_tensors, t, sizeof t);
    m.n_op_seq = m.n_op_start_ns = m.n_op_end_ns = 3;
    m.n_op_name = m.n_op_n_in = m.n_op_n_out = 3;
    m.op_seq = s->c_seq, m.op_start_ns = s->c_start, m.op_end_ns = s->c_end;
    m.op_name = s->c_name, m.op_n_in = s->c_n_in, m.op_n_out = s->c_n_out;
    m.n_tensors = 7, m.tensors = s->c_tensors;
    for (int i = 0; i < 3; i++) {
      s->d_id[i] = 7 + (uint32_t)i;
      s->d_bytes[i] = 4096u << i;
      s->d_kind[i] = (Capuchin__TensorKind)i;
    }
    m.n_decl_id = m.n_decl_bytes = m.n_decl_kind = 3;
    m.decl_id = s->d_id, m.decl_bytes = s->d_bytes, m.decl_kind = s->d_kind;
    s->f_t[0] = 40, s->f_t[1] = 61;
    s->f_tensor[0] = 3, s->f_tensor[1] = 8;
    m.n_free_t_ns = m.n_free_tensor = 2;
    m.free_t_ns = s->f_t, m.free_tensor = s->f_tensor;
    m.has_dropped = 1, m.dropped = 0;
    s->batch = m;
    s->env.access_batch = &s->batch;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_FREE: {
    Capuchin__Free m = CAPUCHIN__FREE__INIT;
    m.has_t_ns = 1, m.t_ns = 39999999;
    m.has_tensor = 1, m.tensor = 1000;
    s->free_ = m;
    s->env.free = &s->free_;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_ITERATION_END: {
    Capuchin__IterationEnd m = CAPUCHIN__ITERATION_END__INIT;
    m.has_iteration = 1, m.iteration = 2;
    m.has_iter_ns = 1, m.iter_ns = 40123456;
    m.has_peak_bytes = 1, m.peak_bytes = 3000000000ull;
    m.has_bytes_out = 1, m.bytes_out = 1u << 30;
    m.has_bytes_in = 1, m.bytes_in = 1u << 30;
    m.has_stall_ns = 1, m.stall_ns = 12345;
    m.has_measured = 1, m.measured = 0;
    m.has_incomplete = 1, m.incomplete = 0;
    m.has_mode = 1, m.mode = CAPUCHIN__MODE__MODE_GUIDED;
    m.has_plan_version = 1, m.plan_version = 1;
    m.has_recompute_ops = 1, m.recompute_ops = 12;
    m.has_recompute_ns = 1, m.recompute_ns = 400000;
    m.has_evictions = 1, m.evictions = 80;
    s->iter_end = m;
    s->env.iteration_end = &s->iter_end;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_FEEDBACK: {
    Capuchin__Feedback m = CAPUCHIN__FEEDBACK__INIT;
    Capuchin__PrefetchStall st = CAPUCHIN__PREFETCH_STALL__INIT;
    st.has_tensor = st.has_back_access = st.has_stall_ns = 1;
    st.tensor = 12, st.back_access = 2, st.stall_ns = 150000;
    s->stall0 = st;
    st.tensor = 99, st.back_access = 5, st.stall_ns = 0;
    s->stall1 = st;
    s->stalls[0] = &s->stall0, s->stalls[1] = &s->stall1;
    m.has_plan_version = 1, m.plan_version = 1;
    m.has_iteration = 1, m.iteration = 3;
    m.n_stalls = 2, m.stalls = s->stalls;
    s->feedback = m;
    s->env.feedback = &s->feedback;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_PLAN: {
    Capuchin__Plan m = CAPUCHIN__PLAN__INIT;
    Capuchin__PlanAction a = CAPUCHIN__PLAN_ACTION__INIT;
    a.has_tensor = a.has_evict_after_access = a.has_method = 1;
    a.tensor = 10, a.evict_after_access = 1;
    a.method = CAPUCHIN__METHOD__METHOD_SWAP;
    a.has_prefetch_tensor = a.has_prefetch_access = 1;
    a.prefetch_tensor = 30, a.prefetch_access = 2;
    s->act0 = a;
    a = (Capuchin__PlanAction)CAPUCHIN__PLAN_ACTION__INIT;
    a.has_tensor = a.has_evict_after_access = a.has_method = 1;
    a.tensor = 11, a.evict_after_access = 2;
    a.method = CAPUCHIN__METHOD__METHOD_SWAP;
    a.has_flags = 1, a.flags = 1; /* CAP_ACTION_SYNC_OUT, on demand */
    s->act1 = a;
    a = (Capuchin__PlanAction)CAPUCHIN__PLAN_ACTION__INIT;
    a.has_tensor = a.has_evict_after_access = a.has_method = 1;
    a.tensor = 12, a.evict_after_access = 1;
    a.method = CAPUCHIN__METHOD__METHOD_RECOMPUTE;
    s->rec_ops[0] = 4, s->rec_ops[1] = 5, s->rec_ops[2] = 6;
    a.n_recompute_ops = 3, a.recompute_ops = s->rec_ops;
    s->act2 = a;
    s->acts[0] = &s->act0, s->acts[1] = &s->act1, s->acts[2] = &s->act2;
    m.has_version = 1, m.version = 2;
    m.has_budget_bytes = 1, m.budget_bytes = 3ull << 30;
    m.policy = "capuchin";
    m.has_predicted_iter_ns = 1, m.predicted_iter_ns = 41000000;
    m.has_predicted_peak_bytes = 1, m.predicted_peak_bytes = 3ull << 30;
    m.n_actions = 3, m.actions = s->acts;
    s->plan = m;
    s->env.plan = &s->plan;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_PLAN_ACK: {
    Capuchin__PlanAck m = CAPUCHIN__PLAN_ACK__INIT;
    m.has_version = 1, m.version = 2;
    s->ack = m;
    s->env.plan_ack = &s->ack;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_ERROR: {
    Capuchin__Error m = CAPUCHIN__ERROR__INIT;
    m.has_code = 1, m.code = CAP_EPROTO;
    m.message = "access_batch: op_name[17] = 40 out of range (3 names)";
    s->error = m;
    s->env.error = &s->error;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_BYE: {
    Capuchin__Bye m = CAPUCHIN__BYE__INIT;
    m.reason = "training finished";
    s->bye = m;
    s->env.bye = &s->bye;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE: {
    Capuchin__BudgetUpdate m = CAPUCHIN__BUDGET_UPDATE__INIT;
    m.has_budget_bytes = 1, m.budget_bytes = 1ull << 30;
    m.reason = "device shared with job 4";
    s->budget = m;
    s->env.budget_update = &s->budget;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_ACK: {
    Capuchin__BudgetAck m = CAPUCHIN__BUDGET_ACK__INIT;
    m.has_budget_bytes = 1, m.budget_bytes = 1ull << 30;
    m.has_device_bytes = 1, m.device_bytes = 1000ull << 20;
    s->budget_ack = m;
    s->env.budget_ack = &s->budget_ack;
    break;
  }
  default:
    return;
  }
  s->env.msg_case = (Capuchin__Envelope__MsgCase)which;
}

#endif /* CAP_PROTO_SAMPLES_H */
