#!/usr/bin/env bash
# Runs the framework suite (tests/frameworks/) three times: on a local directory, on an expressfs mount of a
# directory bucket and on a mount of a general-purpose bucket, both served by the bundled emulator on
# 127.0.0.1. Prints a test x {local, directory, general} table and each failure's error.
#
# Exit 0 when the local column is all green (the mounts are expected to be red until issue 18 lands);
# with --require-mounts the two mount columns must be green too.
#
# With --guard, the tests listed in tests/frameworks/passing-on-mounts.txt must pass on their mounts (what
# already works must keep working; scripts/test.sh, and so CI, runs the suite this way).
#
# usage: scripts/run-framework-suite.sh [--require-mounts] [--guard] [--markdown] [--keep] [-- PYTEST_ARGS...]
#   --markdown   print the table as Markdown (for docs/frameworks-status.md)
#   --keep       keep the work directory (emulator data, daemon logs, JUnit files) and print where it is
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

REQUIRE=local
MUST_PASS=()
MARKDOWN=()
KEEP=0
PYTEST_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --require-mounts) REQUIRE=local,directory,general ;;
    --guard) MUST_PASS=(--must-pass "$ROOT/tests/frameworks/passing-on-mounts.txt") ;;
    --markdown) MARKDOWN=(--markdown) ;;
    --keep) KEEP=1 ;;
    --) shift; PYTEST_EXTRA=("$@"); break ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

export AWS_EC2_METADATA_DISABLED=true
export AWS_ACCESS_KEY_ID=AKIDEXPRESSFSTEST
export AWS_SECRET_ACCESS_KEY=expressfs-test-secret
export AWS_REGION=us-east-1
unset AWS_PROFILE AWS_SESSION_TOKEN

EXPRESSFS=$ROOT/target/debug/expressfs
EMULATOR=$ROOT/target/debug/expressfs-emulator
if [ ! -x "$EXPRESSFS" ] || [ ! -x "$EMULATOR" ]; then
  echo "== building expressfs and the emulator (debug)"
  cargo build --locked -p expressfs -p expressfs-emulator 2>&1 | tail -n 2
fi
PY=$ROOT/.venv-frameworks/bin/python
bash scripts/install-frameworks.sh

WORK=$(mktemp -d /tmp/expressfs-frameworks-XXXXXX)
EMU_PID=""
MOUNTS=()
# From the mount table, not stat(): a crashed daemon's mount answers ENOTCONN and would look unmounted.
is_mounted() { awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo; }
cleanup() {
  set +e
  for mnt in "${MOUNTS[@]}"; do
    if is_mounted "$mnt"; then
      umount "$mnt" 2>/dev/null || { sleep 1; umount "$mnt" 2>/dev/null; } || umount -l "$mnt"
    fi
  done
  # The daemons exit once unmounted; give them a moment to finish before the emulator goes away.
  sleep 0.5
  if [ -n "$EMU_PID" ]; then
    kill "$EMU_PID" 2>/dev/null
    wait "$EMU_PID" 2>/dev/null
  fi
  if [ "$KEEP" = 1 ]; then
    echo "work directory kept: $WORK (daemon logs in $WORK/logs-*)"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

DIR_BUCKET=frameworks--use1-az4--x-s3
GP_BUCKET=frameworks-general
"$EMULATOR" --listen 127.0.0.1:0 --data-dir "$WORK/data" --bucket "$DIR_BUCKET" --bucket "$GP_BUCKET" \
  --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" --region "$AWS_REGION" \
  >"$WORK/emulator.out" 2>"$WORK/emulator.err" &
EMU_PID=$!
ENDPOINT=""
for _ in $(seq 100); do
  ENDPOINT=$(sed -n 's/.*listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$WORK/emulator.out" | head -n 1)
  [ -n "$ENDPOINT" ] && break
  kill -0 "$EMU_PID" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$ENDPOINT" ]; then
  echo "emulator did not start:" >&2
  cat "$WORK/emulator.out" "$WORK/emulator.err" >&2
  exit 1
fi
case "$ENDPOINT" in http://127.*) ;; *) echo "emulator is not on loopback: $ENDPOINT" >&2; exit 1 ;; esac
echo "== emulator at $ENDPOINT: $DIR_BUCKET, $GP_BUCKET"

# The suite's attribute tests need --preserve-metadata (issue 18); pass it as soon as the daemon has it.
FLAGS=(--endpoint-url "$ENDPOINT" --region "$AWS_REGION" --allow-overwrite --allow-delete)
if "$EXPRESSFS" --help | grep -q -- '--preserve-metadata'; then
  FLAGS+=(--preserve-metadata)
fi

# mount NAME BUCKET: mounts at $WORK/mnt-NAME and writes $WORK/remount-NAME.sh, which the attribute tests
# call so that what they check comes back from the bucket rather than from the daemon's memory.
mount_bucket() {
  local name=$1 bucket=$2 mnt=$WORK/mnt-$1 logs=$WORK/logs-$1
  mkdir -p "$mnt" "$logs"
  {
    echo "#!/usr/bin/env bash"
    echo "set -e"
    printf 'if awk -v m=%q '\''$5 == m { f = 1 } END { exit !f }'\'' /proc/self/mountinfo; then umount %q; fi\n' \
      "$mnt" "$mnt"
    printf '%q ' "$EXPRESSFS" "${FLAGS[@]}" --log-directory "$logs" "$bucket" "$mnt"
    echo
  } >"$WORK/remount-$name.sh"
  chmod +x "$WORK/remount-$name.sh"
  MOUNTS+=("$mnt")
  if ! bash "$WORK/remount-$name.sh" || ! is_mounted "$mnt"; then
    echo "mount of $bucket failed; its log:" >&2
    cat "$logs"/* >&2 2>/dev/null
    return 1
  fi
}

# suite NAME DIR [REMOUNT]: one column, its results in $WORK/NAME.xml.
suite() {
  local name=$1 dir=$2 remount=${3:-}
  echo "== suite on $name ($dir)"
  # pytest exits non-zero when a test fails; the table below decides the exit code.
  EXPRESSFS_TEST_DIR=$dir EXPRESSFS_REMOUNT_CMD=$remount \
    timeout 1800 "$PY" -m pytest "$ROOT/tests/frameworks" -q -p no:cacheprovider -rN --tb=line \
    --junitxml="$WORK/$name.xml" "${PYTEST_EXTRA[@]}" | tail -n 1 || true
}

mkdir -p "$WORK/local"
suite local "$WORK/local"
if mount_bucket directory "$DIR_BUCKET"; then
  suite directory "$WORK/mnt-directory" "$WORK/remount-directory.sh"
fi
if mount_bucket general "$GP_BUCKET"; then
  suite general "$WORK/mnt-general" "$WORK/remount-general.sh"
fi

# What the daemons refused or do not implement, with counts: the other half of each failure's story.
for name in directory general; do
  [ -d "$WORK/logs-$name" ] || continue
  echo "== $name: operations the daemon failed (count, then its log's reason)"
  cat "$WORK/logs-$name"/* 2>/dev/null |
    sed -n -e 's/.*operation failed \(op=.*\)/\1/p' -e 's/.*\[Not Implemented\] \([a-z_]*\).*/op="\1" not implemented (ENOSYS)/p' |
    sort | uniq -c | sort -rn || true
done

echo
"$PY" "$ROOT/tests/frameworks/report.py" "${MARKDOWN[@]}" "${MUST_PASS[@]}" --require "$REQUIRE" \
  local="$WORK/local.xml" directory="$WORK/directory.xml" general="$WORK/general.xml"
