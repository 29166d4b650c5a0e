#!/bin/bash
# One autotune study across a SLURM cluster: every array task joins the same study on a
# PostgreSQL server, one node's GPUs each. Submit with:
#     sbatch examples/slurm_array.sh search_spaces/cifar10_resnet18.yaml
#
# Before the first submission: a PostgreSQL database the nodes can reach, and autotune installed
# with its driver in a virtual environment they share:
#     python3 -m venv ~/autotune-venv && ~/autotune-venv/bin/pip install -e ".[postgres]"
# The password stays out of this file and of `ps`: put it in ~/.pgpass (chmod 600), one line
#     db.example.org:5432:autotune:autotune:YOUR_PASSWORD
# and libpq (through psycopg) reads it. Watch the study from any machine with
#     autotune dashboard --storage "$AUTOTUNE_STORAGE" --artifacts ~/autotune-artifacts
#
#SBATCH --job-name=autotune
#SBATCH --array=0-3                  # four nodes join the study; add more while it runs
#SBATCH --nodes=1
#SBATCH --gres=gpu:8                 # every GPU of the node: one autotune worker per GPU
#SBATCH --cpus-per-task=64           # the cores the workers share (equal shares, one each)
#SBATCH --time=08:00:00
#SBATCH --output=autotune-%A_%a.log
#SBATCH --signal=B:TERM@120          # SIGTERM two minutes before the limit: trials recorded

set -euo pipefail

space_file="${1:?usage: sbatch examples/slurm_array.sh SPACE_FILE}"
export AUTOTUNE_STORAGE="postgresql+psycopg://autotune@db.example.org:5432/autotune"
# exported scripts and reports of the study, attached for the dashboard: a folder every node sees
export AUTOTUNE_ARTIFACTS="$HOME/autotune-artifacts"
source ~/autotune-venv/bin/activate

# Every task runs the same command: the first creates the study, the others join it; trials are
# counted and started under the study's lock, so n_trials holds across nodes. A node that dies
# stops beating; another one fails its running trials after three heartbeat intervals and
# queues them again. `exec` lets SLURM's SIGTERM reach autotune, which records the running
# trials as interrupted: resubmitting the same array resumes the study.
exec autotune run "$space_file" --gpus all
