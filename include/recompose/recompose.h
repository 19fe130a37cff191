// recompose: activation checkpointing for LibTorch. One header for the whole public API.
#pragma once

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>
#include <recompose/checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/checkpoint_options.h>
#include <recompose/checkpoint_state.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/device_memory.h>
#include <recompose/graph_exec_group.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/hooks/forward_hooks.h>
#include <recompose/hooks/module_state.h>
#include <recompose/memory_snapshot.h>
#include <recompose/planner.h>
#include <recompose/policy_report.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/selective_checkpoint.h>
#include <recompose/step_ledger.h>
#include <recompose/swap.h>
