#!/usr/bin/env bash
# Issue 27: compare and train on a small tmpfs that fills up, then again once there is room.
# Prints, per case: the exit code, the lines on stderr, the temporary files left behind, and the exit
# code of the same command after the filler is removed. Needs root (it mounts a tmpfs).
#   bash benchmarks/full_disk.sh            # this checkout's trainwise
#   PY=/tmp/oldvenv/bin/python bash benchmarks/full_disk.sh   # another venv's (an old commit installed in it)
set -u
PY=${PY:-.venv/bin/python}
case $PY in /*) ;; *) PY=$PWD/$PY ;; esac  # absolute, the venv's own link kept (not resolved)
cd /tmp  # not a checkout: `python -m` would import the trainwise of the current directory
FS=$(mktemp -d /tmp/trainwise-full-XXXX)
export HF_HUB_OFFLINE=1
tw() { "$PY" -m trainwise.cli "$@"; }
report() {  # name rc errfile out
  local left; left=$(find "$4" -name '*.tmp*' 2>/dev/null | wc -l)
  printf '%-28s exit %-3s stderr %3s lines  temporary files left %s\n' "$1" "$2" "$(wc -l <"$3")" "$left"
  grep -m1 -E '^trainwise: error|Error|error:' "$3" | cut -c1-160 | sed 's/^/    /'
}

# compare: the disk fills while the reports are written (about 60 KiB free after the trial)
mount -t tmpfs -o size=600k tmpfs "$FS"
dd if=/dev/zero of="$FS/fill" bs=1k count=120 status=none
args=(compare --model-preset bert-tiny --strategies baseline --max-steps 3 --warmup-steps 1 --out "$FS/c")
tw "${args[@]}" >/dev/null 2>"$FS.err"; rc=$?
cp "$FS.err" /tmp/full-disk-compare.err
report "compare, reports" "$rc" "$FS.err" "$FS/c"
rm -f "$FS/fill"
tw "${args[@]}" >/dev/null 2>"$FS.err"; echo "    again with room: exit $? ($(grep -c '(stored)' "$FS.err") trial(s) from the store)"
umount "$FS"

# train: the disk fills at a checkpoint or a model directory
mount -t tmpfs -o size=3m tmpfs "$FS"
args=(train --model-preset bert-tiny --max-steps 6 --save-every 3 --eval-every 3 --out "$FS/t")
tw "${args[@]}" >/dev/null 2>"$FS.err"; rc=$?
cp "$FS.err" /tmp/full-disk-train.err
report "train, checkpoint" "$rc" "$FS.err" "$FS/t"
umount "$FS"
mount -t tmpfs -o size=12m tmpfs "$FS"  # "room again" is a bigger file system here: the rerun starts afresh
tw "${args[@]}" >/dev/null 2>"$FS.err"; echo "    on room: exit $?"
umount "$FS"
rmdir "$FS"; rm -f "$FS.err"
