#!/bin/bash
# Run the experiment matrix locally, one run after another, then the analysis: the same lists and
# run folders as jobs/matrix-array.sbatch (2 placements x 4 link profiles x 3 seeds = 24 runs),
# each run bounded by MAX_SECONDS (default 150 s: the matrix fits in about an hour on 2 cores;
# most runs stop earlier, at the return target).
#
#   bash jobs/run-matrix.sh                        # from the repository root, venv active
#   EXPERIMENT_DIR=experiments/x MAX_SECONDS=300 MPIRL_ARGS="--env Acrobot-v1" bash jobs/run-matrix.sh
#
# Knobs: EXPERIMENT_DIR (experiments/local-<time>), MAX_SECONDS (150), NTASKS (9), MPIRL_ARGS,
# ONLY="0 5 7" (run only these matrix cells), MPIRL_DRY_RUN=1 (print the commands).
set -euo pipefail
cd "$(dirname "$0")/.."
export EXPERIMENT_DIR=${EXPERIMENT_DIR:-experiments/local-$(date +%Y%m%d-%H%M%S)}
export MAX_SECONDS=${MAX_SECONDS:-150}
export NTASKS=${NTASKS:-9}
listing=$(bash jobs/matrix-array.sbatch --list)  # no pipe into head: SIGPIPE + pipefail
total=$(sed -n -E '1s/.*\(([0-9]+) runs.*/\1/p' <<< "$listing")
cells=${ONLY:-$(seq 0 $(( total - 1 )))}
failed=0
for i in $cells; do
    if ! SLURM_ARRAY_TASK_ID=$i bash jobs/matrix-array.sbatch; then
        echo "run $i failed (continuing with the others)" >&2
        failed=$(( failed + 1 ))
    fi
done
if [[ -z ${MPIRL_DRY_RUN:-} ]]; then
    python -m analysis.compare "$EXPERIMENT_DIR"
fi
echo "matrix done: $EXPERIMENT_DIR ($failed failed)"
[[ $failed -eq 0 ]]
