# Shared by the modprobe and rmmod shims: finds the kprobefs control file and writes
# one command to it.  Sourced, not run.
#
# The mount is $KPROBEFS_MOUNT when set, else the first mount listed in /proc/mounts
# that has kprobefs/modules (the daemon's debugfs root).

kprobefs_control() {
    if [ -n "$KPROBEFS_MOUNT" ]; then
        printf '%s/kprobefs/modules\n' "$KPROBEFS_MOUNT"
        return 0
    fi
    local _src mnt _rest
    while read -r _src mnt _rest; do
        if [ -w "$mnt/kprobefs/modules" ]; then
            printf '%s/kprobefs/modules\n' "$mnt"
            return 0
        fi
    done < /proc/mounts
    return 1
}

# kprobefs_module_cmd CMD NAME [PARAM...]: prints nothing on success; on failure prints
# the strerror text of the failed write (e.g. "No such file or directory") and returns 1.
kprobefs_module_cmd() {
    local ctl err
    ctl=$(kprobefs_control) || { echo "no kprobefs mount"; return 1; }
    err=$( { printf '%s\n' "$*" > "$ctl"; } 2>&1 ) && return 0
    case "$err" in
        *"write error: "*) err=${err##*write error: } ;;
        *": "*) err=${err##*: } ;;
    esac
    printf '%s\n' "$err"
    return 1
}
