#!/usr/bin/env bash
# The first GPU session's command (issues 26 and 28): prove the CUDA paths on a lent H100/H200.
#
# The GPU machine starts bare (torch 2.11, torchvision 0.26, no optuna, no package index) and
# runs one command for at most 10 minutes, so the proof comes in parts, each well inside that:
#
#   bash benchmarks/gpu_proof.sh versions   # GPU, driver, CUDA, cuDNN, torch; nvidia-smi     (~10 s)
#   bash benchmarks/gpu_proof.sh tests      # tests/test_gpu.py, 4 processes                    (~4 min)
#   bash benchmarks/gpu_proof.sh harness    # harness_overhead.py --device cuda --batch-size 512 (~2 min)
#   bash benchmarks/gpu_proof.sh stage1     # the plan's estimate, then stage 1 of the ResNet-18 (~5 min)
#   bash benchmarks/gpu_proof.sh study      # versus_checklist.py on cifar10_resnet18.yaml      (~5-7 min)
#   bash benchmarks/gpu_proof.sh lm         # versus_checklist.py on language_model.yaml        (~6 min)
#   bash benchmarks/gpu_proof.sh verify     # a 150 s ResNet-18 study, then autotune verify --epochs 10 (~7 min)
#   bash benchmarks/gpu_proof.sh all        # every part, one after the other (a machine without the limit)
#   bash benchmarks/gpu_proof.sh quick      # versions, tests, harness (3 repeats), and stage 1 of a
#                                           # 180 s study (a 90 s budget): one 10-minute command  (~8 min)
#
# Each part installs the wheels in .whl/ (run ../shared/gpu/prepare.sh once, here, and carry .whl)
# into /tmp/site when optuna is missing, and writes its log under $OUT (the folder the device tool
# brings back; ./gpu-proof elsewhere). The printed rows are what BENCHMARKS.md needs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-proof}
mkdir -p "$OUT"
part=${1:-all}

if ! python3 -c "import optuna" 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
  else
    echo "optuna is missing and there is no .whl/: run ../shared/gpu/prepare.sh first" >&2
    exit 2
  fi
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}

run() {  # run NAME SECONDS COMMAND...: its output on the terminal and in $OUT/NAME.log
  local name=$1 seconds=$2
  shift 2
  echo "== $name: $*"
  timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
  local status=${PIPESTATUS[0]}
  echo "== $name: exit $status"
  return "$status"
}

versions() {
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
  run versions 60 python3 - <<'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB", "capability", f"{p.major}.{p.minor}",
          "SMs", p.multi_processor_count)
    import pynvml
    pynvml.nvmlInit()
    print("driver", pynvml.nvmlSystemGetDriverVersion())
else:
    print("no CUDA device")
EOF
}

# four processes (pytest-xdist, in the GPU image): every test's outcome in about 4 minutes
# (on an H100, 2026-11-26: 28 tests in 186 s with -n 6)
tests() { run test_gpu 540 python3 -m pytest -q -p no:cacheprovider -n ${JOBS:-4} tests/test_gpu.py; }

harness() {
  run harness 540 python3 benchmarks/harness_overhead.py --device cuda --batch-size 512 \
    --repeats "${REPEATS:-5}"
}

stage1() {
  local timeout=${STAGE1_STUDY_SECONDS:-500}
  run stage1_plan 60 python3 benchmarks/stage1_cost.py --plan search_spaces/cifar10_resnet18.yaml
  # stage 1, bounded by its budget: a study of 1 trial with 500 s, so stage 1 gets 250 s
  run stage1 $((timeout + 60)) python3 -m autotune run search_spaces/cifar10_resnet18.yaml \
    --n-trials 1 --timeout "$timeout" --storage "sqlite:///$OUT/stage1.db"
}

quick() {
  versions
  JOBS=6 tests
  REPEATS=3 harness
  STAGE1_STUDY_SECONDS=180 stage1
}

# issue 38: the answer against the untuned baseline and the tuning checklist, side by side
study() { against search_spaces/cifar10_resnet18.yaml resnet; }
lm() { against search_spaces/language_model.yaml lm; }

# against SPACE NAME: a study kept in $OUT/NAME.db (each trial records stage 1's predicted and
# its measured samples/s), then the answer, the untuned baseline and the checklist side by side
# in one process
against() {
  local storage="sqlite:///$OUT/$2.db"
  run "$2_study" 420 python3 -m autotune run "$1" --timeout "${STUDY_SECONDS:-180}" \
    --storage "$storage" || return
  run "$2" 170 python3 benchmarks/versus_checklist.py "$1" --storage "$storage" --repeats 2 \
    ${VERSUS_ARGS:-}
}

# issue 43: the answer, the checklist and the untuned baseline at 10 epochs, to the target
verify() {
  local storage="sqlite:///$OUT/verify.db"
  run verify_study 300 python3 -m autotune run search_spaces/cifar10_resnet18.yaml \
    --timeout "${STUDY_SECONDS:-150}" --storage "$storage"
  run verify 280 python3 -m autotune verify --storage "$storage" --epochs "${EPOCHS:-10}"
}

status=0
case "$part" in
  versions | tests | harness | stage1 | study | lm | verify | quick) "$part" || status=$? ;;
  all) for p in versions tests harness stage1 study lm verify; do "$p" || status=$?; done ;;
  *) echo "usage: $0 versions|tests|harness|stage1|study|lm|verify|quick|all" >&2; exit 2 ;;
esac
exit "$status"
