#!/usr/bin/env bash
# Carry a long study across sessions on machines that do not keep their disks (issue 38): the
# study lives in its own PostgreSQL database; `save` stops its worker (only its own: the pid
# `restore` wrote) at a step boundary (the running run is handed back to the queue, its
# checkpoint saved), stops its API and dumps the database next to this script (the commit its
# code runs from is recorded beside it); `restore` recreates the database from
# the dump and starts the API and one worker from that same commit (a git worktree), so every
# run of the study trains the same code. A run handed back without its checkpoint (the data
# directory is not carried) starts over from step 0; its stored steps are overwritten, never
# doubled (the upserts on (run, key, step)).
#
#   bench/studies/carry.sh save    NAME      # → bench/studies/NAME.dump, NAME.commit
#   bench/studies/carry.sh save    NAME --at-run-end   # the same once the running run has ended
#   bench/studies/carry.sh restore NAME      # → serve on :8100 and a worker, from NAME.commit
#   bench/studies/carry.sh status  NAME      # runs of the study: step, status, attempt
#
# Environment: STUDY_ROOT (default /work/study: data dir, logs, worktree), STUDY_DB (default
# study_NAME), PGHOST/PGUSER
# (default 127.0.0.1/postgres), STUDY_REDIS (default redis://127.0.0.1:6379/12).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cmd="${1:?save | restore | status}"
name="${2:?study name, e.g. smollm2_paper_regime}"
root="${STUDY_ROOT:-/work/study}"
db="${STUDY_DB:-study_${name}}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
export CONSPO_DATABASE_URL="postgresql+psycopg://${PGUSER}@${PGHOST}:5432/${db}"
export CONSPO_BROKER_URL="${STUDY_REDIS:-redis://127.0.0.1:6379/12}"
export CONSPO_DATA_DIR="$root/data" CONSPO_MODEL_STORE="$root/store" CONSPO_VLLM_PYTHON=
python="$repo/.venv/bin/python"

case "$cmd" in
  save)
    if [ "${3:-}" = "--at-run-end" ]; then  # lose no partial run: wait for the running one
      current="$(psql -tA -d "$db" -c "select id from runs where status = 'running' limit 1")"
      while [ -n "$current" ] &&
        [ "$(psql -tA -d "$db" -c "select status from runs where id = $current")" = running ]; do
        sleep 5
      done
    fi
    # the study's own worker (restore wrote its pid), never another worker on this machine
    worker="$(cat "$root/worker.pid" 2>/dev/null || true)"
    if [ -n "$worker" ] && kill -TERM "$worker" 2>/dev/null; then  # hands the running run back
      for _ in $(seq 120); do kill -0 "$worker" 2>/dev/null || break; sleep 2; done
    fi
    [ -f "$root/serve.pid" ] && kill "$(cat "$root/serve.pid")" 2>/dev/null || true
    pg_dump -Fc "$db" > "$here/$name.dump"
    ls -l "$here/$name.dump"
    ;;
  restore)
    commit="$(cat "$here/$name.commit")"
    mkdir -p "$root"
    [ -d "$root/code" ] || git -C "$repo" worktree add --detach "$root/code" "$commit"
    dropdb --if-exists "$db"
    createdb "$db"
    pg_restore --no-owner -d "$db" "$here/$name.dump"
    cd "$root/code"
    export PYTHONPATH="$root/code"
    nohup "$python" -m conspo_lab.cli serve --port 8100 >> "$root/serve.log" 2>&1 &
    echo $! > "$root/serve.pid"
    nohup nice -n 5 "$python" -m conspo_lab.cli worker >> "$root/worker.log" 2>&1 &
    echo $! > "$root/worker.pid"
    echo "serving on http://127.0.0.1:8100 from $commit; worker log $root/worker.log"
    ;;
  status)
    psql -d "$db" -c "select id, name, step, total_steps, status, attempt from runs order by id"
    ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
