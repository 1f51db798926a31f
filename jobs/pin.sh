#!/bin/sh
# Pin the learner alone on one core: world rank 0 runs on the first CPU this job may use, every
# other rank (buffers, actors) on the remaining ones (Linux taskset). Put it between the launcher
# and the program:
#
#   mpirun -n 5 jobs/pin.sh python -m mpirl.main ...
#   launcher = ["mpirun", "-n", "{ranks}", "jobs/pin.sh"]      # in a sweep spec (mpirl.sweep)
#
# The rank comes from the launcher's environment: PMI_RANK (MPICH's Hydra), OMPI_COMM_WORLD_RANK
# (Open MPI) or SLURM_PROCID (srun). The learner's evaluation process (--evaluator process)
# inherits core 0 with it. With a single usable CPU nothing is pinned (a warning says so).
set -eu
rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-}}}"
if [ -z "$rank" ]; then
    echo "jobs/pin.sh: no rank in the environment (PMI_RANK, OMPI_COMM_WORLD_RANK or" \
         "SLURM_PROCID); start it under mpirun or srun: mpirun -n N jobs/pin.sh python -m" \
         "mpirl.main ..." >&2
    exit 2
fi
if [ "$#" -eq 0 ]; then
    echo "jobs/pin.sh: no program to run; usage: jobs/pin.sh PROGRAM [ARGS...]" >&2
    exit 2
fi
# the CPUs this process may use, one per line ("0-3,6" -> 0 1 2 3 6)
cpus=$(awk '/^Cpus_allowed_list:/ { n = split($2, parts, ",");
    for (i = 1; i <= n; i++) { m = split(parts[i], r, "-");
        lo = r[1]; hi = (m > 1) ? r[2] : r[1]; for (c = lo; c <= hi; c++) print c } }' \
    /proc/self/status)
first=$(echo "$cpus" | head -n 1)
rest=$(echo "$cpus" | tail -n +2 | paste -sd, -)
if [ -z "$rest" ]; then
    [ "$rank" = 0 ] && echo "jobs/pin.sh: one usable CPU ($first): nothing pinned" >&2
    exec "$@"
fi
if [ "$rank" = 0 ]; then
    exec taskset -c "$first" "$@"
fi
exec taskset -c "$rest" "$@"
