#!/usr/bin/env bash
# Every GPU claim of longpack measured by one command, in one report (docs/GPU.md).
#
#   tools/gpu_suite.sh [--out DIR] [--budget SECONDS] [--only STEP,...] [--skip STEP,...]
#                      [--limit STEP=SECONDS ...] [--commit TEXT] [--python PY] [--wheels DIR]
#                      [--work DIR] [--archs-cases mfu_2k,docs_32k]
#   tools/gpu_suite.sh --cpu-smoke [--out DIR] ...   the same steps at toy sizes on the CPU
#   tools/gpu_suite.sh --prepare-wheels [DIR]         once, on a machine with pip's index: the
#                                                     wheels a lent GPU machine lacks, into DIR
#                                                     (default .whl, git-ignored; carry it)
#
# Steps, in this order (the issue's targets first, the tests last), each in its own time limit,
# shrunk to what is left of --budget (default 540 s on a GPU: one command of the device tool,
# which stops at 600 s, with the report written after each step); a step that fails or runs
# out of time is recorded, its log's tail goes into the report, and the next one runs. A step
# the budget leaves no time for is reported as skipped: run it in a second command with --only
# (env and corpus always run). --limit STEP=SECONDS changes one step's limit; --archs-cases picks
# bench_archs' GPU cases (the scan always runs). The limits are a fresh machine's seconds on the
# first GPU (an H200, docs/BENCHMARKS.md 2026-11-26) with room: compiling is most of each step.
#   env       device, driver, versions; every module the project imports (tools/gpu_checks.py)
#   corpus    a hermetic build (words, a byte-level tokenizer named gpt2.tiktoken), rows of 2048
#   zoo       each tiny family on CUDA in bf16: logits vs fp32, finite gradients, a packed row
#             vs its documents alone (FlexAttention), compiled vs eager; then Mamba's scan
#             through flash-linear-attention's kernel vs the PyTorch reference (gpu_checks.py
#             ssd: outputs, gradients, documents; when the `gpu` extra is installed)
#   flex      FlexAttention vs per-document SDPA at 4k and 32k: outputs, gradients, time
#   archs     tools/bench_archs.py --gpu-only: neox-350m at 2k (MFU), neox-1.2b on
#             document-masked 32k rows (tokens/s), resonance and Mamba vs gpt-neox 4k..64k
#   loader    tools/bench_train.py: neox-350m, compiled bf16, the loader's share of a step
#   memory    the `train --dry-run --json` plan vs torch.cuda.max_memory_allocated, 3 presets
#             (this one and the next three: tools/gpu_runs.py)
#   resume    a compiled bf16 20-step run SIGTERMed and resumed: bitwise against a straight run
#             (neox-tiny at the build's vocabulary: compiles fast, the same code paths)
#   torchrun  `torchrun --nproc-per-node 1` DDP and --fsdp (NCCL), the sharded checkpoint resumed
#   tests     the archs tests with CUDA as the default device, the train tests (pytest)
# Writes OUT/gpu_report.md, OUT/gpu_report.json (tools/gpu_report.py: every figure against its
# target) and OUT/gpu_logs.tar.gz. Exit 0 once the report is written, whatever it says; 2 on a
# bad argument or, without --cpu-smoke, when there is no CUDA device.
#
# Installs nothing from a network: the machine's own python3 and torch are used (the repo's
# .venv when it exists here), with the wheels in --wheels DIR (default .whl) installed into the
# work folder first when there are any. Those are what the project needs and a lent machine's
# image lacks, at this checkout's versions: zstandard, and numpy (the image's is newer than the
# project's pin).

set -u -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps_all="env corpus zoo flex archs loader memory resume torchrun tests"
mode=gpu out=${OUT:-$PWD/gpu-report} budget="" only="" skip="" commit="" py="" work=""
archs_cases=mfu_2k,docs_32k
wheels=$root/.whl prepare="" target_python=3.12 limit_over=()

usage() { sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_suite.sh: $*" >&2; exit 2; }
while (( $# )); do
    case $1 in
        --cpu-smoke) mode=cpu-smoke ;;
        --out|--budget|--only|--skip|--commit|--python|--wheels|--work|--limit|--archs-cases)
            (( $# >= 2 )) || die "$1 needs a value"
            case $1 in
                --out) out=$2 ;; --budget) budget=$2 ;; --only) only=$2 ;; --skip) skip=$2 ;;
                --commit) commit=$2 ;; --python) py=$2 ;; --wheels) wheels=$2 ;;
                --work) work=$2 ;;
                --archs-cases) [[ $2 =~ ^(mfu_2k|docs_32k)(,(mfu_2k|docs_32k))*$ ]] \
                                   || die "--archs-cases takes mfu_2k and/or docs_32k"
                               archs_cases=$2 ;;
                --limit) [[ $2 =~ ^[a-z]+=[0-9]+$ ]] || die "--limit takes STEP=SECONDS"
                         limit_over+=("$2") ;;
            esac
            shift ;;
        --prepare-wheels)
            prepare=$wheels
            if (( $# >= 2 )) && [[ $2 != --* ]]; then prepare=$2; shift; fi ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
for s in ${only//,/ } ${skip//,/ } $(for kv in "${limit_over[@]}"; do echo "${kv%%=*}"; done); do
    [[ " $steps_all " == *" $s "* ]] || die "no step '$s': the steps are $steps_all"
done
[[ -z $budget || $budget =~ ^[0-9]+$ ]] || die "--budget takes seconds (got '$budget')"
if [[ -z $py ]]; then
    py=python3
    [[ -x $root/.venv/bin/python ]] && py=$root/.venv/bin/python
fi

if [[ -n $prepare ]]; then
    # The versions this checkout's environment holds, for the lent machine's Python.
    mkdir -p "$prepare" || exit 2
    specs=$("$py" -c 'import importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in ("zstandard", "numpy")))') || exit 2
    # and the `gpu` extra (pyproject.toml): Mamba's scan kernels, pure Python over Triton
    specs+=" fla-core>=0.6 einops"
    # shellcheck disable=SC2086
    exec "$py" -m pip download --no-deps --only-binary=:all: --python-version "$target_python" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$prepare" $specs
fi

work=${work:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-suite.XXXXXX")}
mkdir -p "$work"/steps "$work"/figures "$work"/logs "$out" || exit 2
if [[ -z $commit ]]; then  # on a lent machine there is no .git: pass --commit
    commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null) || commit=unknown
    [[ $commit != unknown && -n $(git -C "$root" status --porcelain -- pipeline training archs \
        tools 2>/dev/null) ]] && commit+=" + local changes"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
checks=("$py" "$root/tools/gpu_checks.py") runs=("$py" "$root/tools/gpu_runs.py")

if [[ $mode == gpu ]]; then
    budget=${budget:-540}
    seq=2048 tokens=2000000 flex_seqs=4096,32768 doc=2048 size=()
    # measured 2026-11-26: env 11, corpus 1, zoo 37 (crashed), flex 70, archs 64 s for the
    # first compiled step of neox-350m and more than 105 s for neox-1.2b at 32k, loader more than
    # 110, memory 108 for 3 presets, torchrun 60 for 3 runs, resume more than 45
    limits=(env=60 corpus=60 zoo=120 flex=90 archs=300 loader=200 memory=120 resume=120
            torchrun=100 tests=150)
    zoo_args=(--compile-families neox-tiny,moe-tiny)
    archs_args=(--gpu-only --repeat 2 --gpu-cases "$archs_cases"
                --gpu-scan-seqs 4096,8192,16384,32768,65536)
    loader_args=(--models neox-350m --seq 2048 --batch 8 --steps 15 --warmup 3 --repeat 1
                 --workers 2 --precision bf16 --compile)
    memory_args=(--presets neox-350m,moe-500m,mamba-370m --batch 4)
    resume_args=(--model neox-tiny --batch 4 --steps 20 --stop-after 2 --compile)
    torchrun_args=(--model neox-tiny --batch 4 --steps 6)
    if compgen -G "$wheels/*.whl" >/dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$work/site" "$wheels"/*.whl >"$work/logs/wheels.log" 2>&1 \
            && export PYTHONPATH=$work/site:$PYTHONPATH \
            || echo "gpu_suite.sh: the wheels in $wheels did not install (logs/wheels.log)" >&2
    fi
else
    budget=${budget:-900}
    seq=128 tokens=150000 flex_seqs=256,512 doc=64 size=(--smoke)
    limits=(env=120 corpus=120 zoo=120 flex=120 archs=120 loader=120 memory=120 resume=120
            torchrun=120 tests=180)
    zoo_args=(--compile-families neox-tiny,moe-tiny)
    archs_args=(--gpu-only --device cpu --toy --repeat 1 --gpu-scan-seqs 256,512)
    loader_args=(--models neox-tiny --seq 128 --batch 2 --steps 3 --warmup 1 --repeat 1
                 --workers 1 --precision fp32 --no-compile)
    memory_args=(--presets neox-tiny,moe-tiny,mamba-tiny --batch 2)
    resume_args=(--model neox-tiny --batch 2 --steps 6 --stop-after 2 --no-compile)
    torchrun_args=(--model neox-tiny --batch 2 --steps 3)
    # the CPU, whatever the machine has; one thread each, as the tests run
    export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
fi
deadline=$(( $(date +%s) + budget ))
shards=$work/corpus/rows-$seq

report() {
    "$py" "$root/tools/gpu_report.py" "$work" "$out" --mode "$mode" >>"$work/logs/report.log" 2>&1
}

step_json() {  # NAME STATUS RC SECONDS LIMIT
    printf '{"name": "%s", "status": "%s", "rc": %s, "seconds": %s, "box": %s}\n' \
        "$1" "$2" "${3:-null}" "${4:-null}" "${5:-null}" >"$work/steps/$1.json"
}

limit_of() {
    local kv
    for kv in "${limits[@]}"; do [[ ${kv%%=*} == "$1" ]] && echo "${kv#*=}"; done
}

run_step() {  # NAME COMMAND...: in the step's time limit, its figures to figures/NAME.jsonl
    local name=$1 limit left rc t0 status
    shift
    # env and corpus always run: the device check and the build the later steps train on
    if [[ $name != env && $name != corpus ]] && { [[ -n $only && ",$only," != *",$name,"* ]] \
            || [[ ",$skip," == *",$name,"* ]]; }; then
        step_json "$name" "skipped: not selected"
        report
        return
    fi
    limit=$(limit_of "$name")
    for kv in "${limit_over[@]}"; do [[ ${kv%%=*} == "$name" ]] && limit=${kv#*=}; done
    left=$(( deadline - $(date +%s) ))
    if (( left < 15 )); then
        step_json "$name" "skipped: the budget of $budget s is spent"
        report
        return
    fi
    (( limit > left )) && limit=$left
    echo "== $name (at most $limit s)"
    t0=$(date +%s.%N)
    GPU_SUITE_FIGURES=$work/figures/$name.jsonl GPU_SUITE_LIMIT=$limit \
        timeout -k 10 "$limit" "$@" >"$work/logs/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status="timed out after $limit s" ;;
        *) status="failed (exit $rc)" ;;
    esac
    seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    step_json "$name" "$status" "$rc" "$seconds" "$limit"
    echo "   $status, $seconds s"
    report
}

run_step env "${checks[@]}" env --out "$work/env.json" --commit "$commit"
if [[ $mode == gpu ]] && ! grep -q '"cuda_available": true' "$work/env.json" 2>/dev/null; then
    report
    echo "gpu_suite.sh: no CUDA device here (see $out/gpu_report.md); --cpu-smoke runs the" \
         "steps at toy sizes on the CPU" >&2
    exit 2
fi
run_step corpus "${checks[@]}" corpus --work "$work/corpus" --tokens "$tokens" --seqs "$seq"
run_step zoo "${checks[@]}" zoo "${size[@]}" "${zoo_args[@]}"
run_step flex "${checks[@]}" flex "${size[@]}" --seqs "$flex_seqs" --doc-len "$doc"
run_step archs "$py" "$root/tools/bench_archs.py" "${archs_args[@]}" \
    --json "$work/figures/archs.records.jsonl"
run_step loader "$py" "$root/tools/bench_train.py" --shards "$shards" --work "$work/loader" \
    --json "$work/figures/loader.records.jsonl" "${loader_args[@]}"
run_step memory "${runs[@]}" memory --work "$work/memory" --shards "$shards" "${memory_args[@]}"
run_step resume "${runs[@]}" resume --work "$work/resume" --shards "$shards" "${resume_args[@]}"
run_step torchrun "${runs[@]}" torchrun --work "$work/torchrun" --shards "$shards" \
    "${torchrun_args[@]}"
run_step tests "${runs[@]}" tests "${size[@]}" --work "$work/tests"

(cd "$work" && find . \( -name '*.log' -o -name '*.xml' -o -name 'metrics.jsonl' -o -name '*.json' \
    -o -name '*.jsonl' \) -not -path './site/*' -size -4M -print0 \
    | tar czf "$out/gpu_logs.tar.gz" --null -T -) 2>/dev/null
report
echo "report: $out/gpu_report.md, $out/gpu_report.json (logs: $out/gpu_logs.tar.gz; work: $work)"
