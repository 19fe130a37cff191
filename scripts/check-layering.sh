#!/usr/bin/env bash
# Checks that every #include in lib/, hooks/ and include/recompose/ respects the layering of
# docs/architecture.md, and that LibTorch internals appear only in the adapters: the headers
# c10/core/impl/*, ATen/native/*, ATen/core/dispatch/* but Dispatcher.h, ATen/SequenceNumber.h and
# autograd-engine headers (torch/csrc/autograd/* but variable.h, custom_function.h, grad_mode.h,
# saved_variable_hooks.h), and the names c10::impl::, at::native::, at::impl::,
# at::sequence_number:: and CPUGeneratorImpl (see docs/architecture.md, "LibTorch internals").
# Exits 1 listing each violation.
#   bash scripts/check-layering.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

# Layers, lowest first. A file may include files of its own layer (component) and of lower ones.
def layer_of(path):
    p = path.replace(os.sep, '/')
    if p == 'include/recompose/checkpoint_error.h': return (0, 'base')
    if p.startswith('hooks/') or p.startswith('include/recompose/hooks/'): return (1, 'hooks')
    # JSON documents (nlohmann/json): read and written by the ledger and the planner.
    if p.startswith('lib/json/'): return (1, 'json')
    # Memory in use on a device (the CUDA caching allocator, the CPU counting allocator and its
    # trace): read by the device-memory front end, the ledger, its snapshot and the planner.
    if p.startswith('lib/memory/') or p == 'include/recompose/cpu_memory_counting.h': return (1, 'memory')
    # What a step did, emitted by the layers above and read by sinks that register.
    if p.startswith('lib/events/'): return (2, 'events')
    if p.startswith('lib/engine/') or p in ('include/recompose/checkpoint_options.h', 'include/recompose/region_contexts.h',
            'include/recompose/region_run.h', 'include/recompose/checkpoint_state.h',
            'include/recompose/saved_tensor_meter.h', 'include/recompose/graph_exec_group.h'): return (3, 'engine')
    if p.startswith('lib/plugin/'): return (4, 'plugin')
    if p.startswith('lib/selective/') or p in ('include/recompose/selective_checkpoint.h', 'include/recompose/policy_report.h'): return (5, 'selective')
    if p.startswith('lib/swap/') or p in ('include/recompose/swap.h', 'include/recompose/apply_offload.h',
            'include/recompose/copy_link.h'): return (5, 'swap')
    if p.startswith('lib/') and p.count('/') == 1: return (6, 'frontend')
    if p in ('include/recompose/apply_checkpoint.h', 'include/recompose/checkpoint.h',
            'include/recompose/device_memory.h'): return (6, 'frontend')
    # The step ledger: a sink of the events, beside the front ends (it reads the engine's memory).
    if p.startswith('lib/ledger/') or p in ('include/recompose/step_ledger.h', 'include/recompose/memory_snapshot.h'): return (6, 'ledger')
    # The memory-budget planner drives the front ends (apply_checkpoint, apply_offload): above them.
    if p.startswith('lib/planner/') or p in ('include/recompose/planner.h', 'include/recompose/memory_plan.h',
            'include/recompose/memory_profile.h'): return (7, 'planner')
    if p == 'include/recompose/recompose.h': return (8, 'umbrella')
    return None

# LibTorch internals and the only files allowed to use them (one adapter per internal).
ADAPTERS = {
    'lib/engine/engine_adapter.cpp',        # autograd engine: default engine stub, graph task id
    'lib/engine/dispatch_keys_adapter.cpp', # thread-local dispatch keys (InternalOpsGuard)
    'lib/engine/device_adapter.cpp',        # device guard impls: streams, device counts
    'lib/engine/region_inputs_adapter.cpp', # SavedVariable: a region's inputs saved without a node
    'lib/engine/autograd_sequence_adapter.cpp',  # node sequence numbers, grad_fn_unsafe (early stop)
    'lib/engine/cpu_generator_adapter.cpp', # CPUGeneratorImpl's engine and normal-sample caches
    'lib/selective/dispatch_interceptor.cpp',  # dispatch modes (TorchDispatchModeTLS, PyInterpreter)
}
PUBLIC_AUTOGRAD = {'variable.h', 'custom_function.h', 'grad_mode.h', 'saved_variable_hooks.h'}

# ATen's dispatcher: Dispatcher.h is the operator-handle API that custom ops use; the rest of
# ATen/core/dispatch/ is its implementation.
PUBLIC_DISPATCH = {'Dispatcher.h'}
# Names of internals, whatever header brought them in (CPUGeneratorImpl.h also declares the
# public getDefaultCPUGenerator, so the class, not the header, is what is checked).
INTERNAL_NAMES = re.compile(r'\b(c10::impl::|at::native::|at::impl::|at::sequence_number::|CPUGeneratorImpl\b)')

def is_internal(header):
    if header.startswith(('c10/core/impl/', 'ATen/native/')) or header == 'ATen/SequenceNumber.h': return True
    m = re.match(r'ATen/core/dispatch/(.*)', header)
    if m: return m.group(1) not in PUBLIC_DISPATCH
    m = re.match(r'torch/csrc/autograd/(.*)', header)
    return bool(m) and m.group(1) not in PUBLIC_AUTOGRAD

include_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
errors = []
files = []
for root in ('lib', 'hooks', 'include/recompose'):
    for d, _, names in os.walk(root):
        files += [os.path.join(d, n) for n in names if n.endswith(('.h', '.cpp', '.cpp.in'))]
for f in sorted(files):
    f = f.replace(os.sep, '/')
    mine = layer_of(f)
    if mine is None:
        errors.append(f'{f}: not in any layer of docs/architecture.md (add it to scripts/check-layering.sh)')
        continue
    for n, line in enumerate(open(f, encoding='utf-8'), 1):
        code = line.split('//', 1)[0]
        used = INTERNAL_NAMES.search(code)
        if used and not include_re.match(line) and f not in ADAPTERS:
            errors.append(f'{f}:{n}: uses the LibTorch internal {used.group(1)} outside the adapters')
        m = include_re.match(line)
        if not m: continue
        kind, header = m.groups()
        if kind == '<' and not header.startswith('recompose/'):
            if is_internal(header) and f not in ADAPTERS:
                errors.append(f'{f}:{n}: includes the LibTorch internal <{header}> outside the adapters')
            continue
        if kind == '<':
            target = 'include/' + header
        else:
            cands = [os.path.normpath(os.path.join(os.path.dirname(f), header)), os.path.normpath(os.path.join('lib', header))]
            target = next((c for c in cands if os.path.exists(c)), None)
            if target is None: continue  # generated or test-only
            target = target.replace(os.sep, '/')
        theirs = layer_of(target)
        if theirs is None: continue
        if theirs[0] > mine[0] or (theirs[0] == mine[0] and theirs[1] != mine[1]):
            errors.append(f'{f}:{n}: {mine[1]} (layer {mine[0]}) includes {target}, {theirs[1]} (layer {theirs[0]})')
for e in errors: print(e)
if errors:
    print(f'check-layering: {len(errors)} violation(s); see docs/architecture.md', file=sys.stderr)
    sys.exit(1)
print(f'check-layering: {len(files)} files respect the layering of docs/architecture.md')
PY
