#!/usr/bin/env bash
# A real multi-node SLURM cluster on this one Linux machine, for tests and CI.
#
#   ci/slurm-cluster.sh up       # start (or repair) the cluster; waits until every node is usable
#   ci/slurm-cluster.sh down     # stop it and undo every change it made to the machine
#   ci/slurm-cluster.sh status   # print sinfo; exit 0 only if the cluster is healthy
#   ci/slurm-cluster.sh config   # print the slurm.conf and gres.conf `up` would write (no root needed)
#
# Layout (defaults; see the environment variables below):
#   login node  = this machine's root namespace: slurmctld, munged, sbatch/srun/squeue/scontrol
#   nodes       = sn1..snN, each its own network + UTS + PID namespace (own hostname, own IP
#                 10.77.0.(10+i) on a private bridge 'slimebr0' = 10.77.0.1/24, no default
#                 route), PID 1 = ci/slurm/node-init.pl which runs `slurmd -D -N snI`
#   GPUs        = 2 fake GPUs per node (GRES backed by char devices c 1 3, never opened), typed
#                 'fake' (Gres=gpu:fake:2) as many sites type theirs: --gres=gpu:fake:N, --gres=gpu:N
#                 and --gpus-per-node=N all work (SLIME_SLURM_GPU_TYPE= for untyped GPUs)
#   partitions  = batch (default, PriorityTier=1) and urgent (PriorityTier=10); urgent jobs
#                 preempt batch jobs, which are requeued (PreemptMode=REQUEUE). Preemption is
#                 graceful, as sites that run long jobs configure it: batch has GraceTime and
#                 SlurmctldParameters=preempt_send_user_signal, so the victim's batch shell gets
#                 its --signal (B:USR1) at once instead of a TERM to every process, and is
#                 TERMed/KILLed only when the grace time ends (or it exits first)
#   config      = /etc/slurm/slurm.conf + gres.conf (where plain sbatch/squeue look; no
#                 SLURM_CONF needed); a previous file is kept in the state dir and put back by down
#   state       = $SLIME_SLURM_STATE_DIR (default /var/lib/slime-slurm): spool, ctld state,
#                 logs in log/, job completion log jobcomp.log, PIDs in pids/, fake devices in dev/
#   /etc/hosts  = a marked block 'slime-slurm' naming the nodes (removed by down)
#
# Guarantees: `up` is idempotent (a healthy cluster is left alone; a broken one is repaired, or
# rebuilt when its settings changed); `down` stops only processes this script started (by the
# PIDs it recorded, checked against their start time), removes namespaces, veths, bridge,
# /etc/hosts block, config and state dir. Not guaranteed: packages installed by `up` stay
# installed; a munged that was already running is used and left running; jobs running during a
# repair that restarts daemons (config or node changes) may be lost or requeued. `up`/`down`
# serialize on /run/lock/slime-slurm.lock (several test sessions may race to start it);
# `status` works without root. Daemons are detached (setsid), so whatever init reaps orphans
# reaps them after `down`; on machines whose init reaps lazily they may linger as zombies.
# Needs root, Linux network namespaces, and Debian packages (installed by `up` if missing:
# slurmctld slurmd slurm-client munge iproute2 procps). Set SLIME_SLURM_KEEP_LOGS=1 to keep
# $STATE/log after down (e.g. for CI artifacts).
#
# Environment:
#   SLIME_SLURM_NODES=2              number of nodes (1..99)
#   SLIME_SLURM_MAX_ARRAY_SIZE=1001  slurm.conf MaxArraySize
#   SLIME_SLURM_STATE_DIR=/var/lib/slime-slurm
#   SLIME_SLURM_SUBNET=10.77.0       first three octets of the private /24
#   SLIME_SLURM_CPUS_PER_NODE=4  SLIME_SLURM_GPUS_PER_NODE=2  SLIME_SLURM_MEM_MB=8000
#   SLIME_SLURM_UP_TIMEOUT=60        seconds `up` waits for the nodes
#   SLIME_SLURM_GPU_TYPE=fake        GRES type of the fake GPUs (set but empty: untyped, gpu:N)
#   SLIME_SLURM_PREEMPT_GRACE=60     GraceTime of the batch partition: a preempted job gets its
#                                    --signal (USR1) at once and this long to checkpoint before TERM
# A second cluster next to the first (say 8 nodes for a bench) needs its own value of each of these,
# and the same SLIME_SLURM_* settings for status/down (clients then need SLURM_CONF=<conf dir>/slurm.conf):
#   SLIME_SLURM_NAME=slime           ClusterName; names the /etc/hosts block and the lock file
#   SLIME_SLURM_CONF_DIR=/etc/slurm  where slurm.conf/gres.conf go (another dir: export SLURM_CONF)
#   SLIME_SLURM_NODE_PREFIX=sn       node (and network namespace) names: <prefix>1..<prefix>N
#   SLIME_SLURM_BRIDGE=slimebr0      the private bridge
#   SLIME_SLURM_CTLD_PORT=6817       slurmctld's port (slurmd's stay 6818, one per namespace)
#   SLIME_SLURM_FIRST_JOB_ID=1       FirstJobId: disjoint job ids keep per-job Ray dirs and ports apart
#   plus SLIME_SLURM_STATE_DIR and SLIME_SLURM_SUBNET above
set -euo pipefail

NAME=${SLIME_SLURM_NAME:-slime}
if [[ $NAME == slime ]]; then _sfx=; _br=slimebr0; else _sfx=-$NAME; _br=sb-$NAME; fi
BRIDGE=${SLIME_SLURM_BRIDGE:-$_br}
CONF_DIR=${SLIME_SLURM_CONF_DIR:-/etc/slurm$_sfx}
PREFIX=${SLIME_SLURM_NODE_PREFIX:-sn}
CTLD_PORT=${SLIME_SLURM_CTLD_PORT:-6817}
FIRST_JOB=${SLIME_SLURM_FIRST_JOB_ID:-1}
readonly CONF_MARK='# slime-slurm: generated by ci/slurm-cluster.sh; "down" removes it'

derive_names() {  # names that follow from NAME and CONF_DIR (again after load_recorded_env)
    TAG=slime-slurm  # the default cluster keeps its historical names
    [[ $NAME == slime ]] || TAG=slime-slurm-$NAME
    HOSTS_BEGIN="# BEGIN $TAG (managed by ci/slurm-cluster.sh; removed by \"down\")"
    HOSTS_END="# END $TAG"
    LOCK_FILE=/run/lock/$TAG.lock
    if [[ $CONF_DIR != /etc/slurm ]]; then export SLURM_CONF=$CONF_DIR/slurm.conf; fi
}
derive_names
readonly PACKAGES=(slurmctld slurmd slurm-client munge iproute2 procps)
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Daemons inherit the working directory: run from / so a checkout removed later leaves none of them in it
# (slurmstepd then fails every step with "Unable to get current working directory").
cd /
readonly SCRIPT_DIR
readonly NODE_INIT="$SCRIPT_DIR/slurm/node-init.pl"

STATE=${SLIME_SLURM_STATE_DIR:-/var/lib/slime-slurm$_sfx}
NODES=${SLIME_SLURM_NODES:-2}
MAX_ARRAY=${SLIME_SLURM_MAX_ARRAY_SIZE:-1001}
NET=${SLIME_SLURM_SUBNET:-10.77.0}
CPUS=${SLIME_SLURM_CPUS_PER_NODE:-4}
GPUS=${SLIME_SLURM_GPUS_PER_NODE:-2}
MEM=${SLIME_SLURM_MEM_MB:-8000}
UP_TIMEOUT=${SLIME_SLURM_UP_TIMEOUT:-60}
PREEMPT_GRACE=${SLIME_SLURM_PREEMPT_GRACE:-60}
GPU_TYPE=${SLIME_SLURM_GPU_TYPE-fake}

log() { printf '[slurm-cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

require_int() {  # name value min max
    if ! [[ $2 =~ ^[0-9]{1,9}$ ]] || ((10#$2 < $3 || 10#$2 > $4)); then
        die "$1='$2' is invalid: expected an integer from $3 to $4"
    fi
}

validate_env() {
    require_int SLIME_SLURM_NODES "$NODES" 1 99
    require_int SLIME_SLURM_MAX_ARRAY_SIZE "$MAX_ARRAY" 1 4000001
    require_int SLIME_SLURM_CPUS_PER_NODE "$CPUS" 1 1024
    require_int SLIME_SLURM_GPUS_PER_NODE "$GPUS" 0 64
    require_int SLIME_SLURM_MEM_MB "$MEM" 100 100000000
    require_int SLIME_SLURM_UP_TIMEOUT "$UP_TIMEOUT" 1 3600
    require_int SLIME_SLURM_PREEMPT_GRACE "$PREEMPT_GRACE" 0 86400
    [[ $NET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
        die "SLIME_SLURM_SUBNET='$NET' is invalid: expected three octets such as 10.77.0"
    [[ $GPU_TYPE =~ ^[A-Za-z0-9_]{0,32}$ ]] ||
        die "SLIME_SLURM_GPU_TYPE='$GPU_TYPE' is invalid: expected letters, digits or _ (or empty)"
    [[ $STATE == /* && $STATE != / ]] ||
        die "SLIME_SLURM_STATE_DIR='$STATE' is invalid: expected an absolute directory path"
    [[ $CONF_DIR == /* && $CONF_DIR != / ]] ||
        die "SLIME_SLURM_CONF_DIR='$CONF_DIR' is invalid: expected an absolute directory path"
    [[ $NAME =~ ^[a-z][a-z0-9]{0,15}$ ]] || die "SLIME_SLURM_NAME='$NAME' is invalid: expected [a-z][a-z0-9]*"
    [[ $PREFIX =~ ^[a-z][a-z0-9]{0,5}$ ]] ||
        die "SLIME_SLURM_NODE_PREFIX='$PREFIX' is invalid: expected 1-6 of [a-z0-9], a letter first"
    [[ $BRIDGE =~ ^[a-z][a-z0-9-]{0,14}$ ]] || die "SLIME_SLURM_BRIDGE='$BRIDGE' is invalid: expected [a-z][a-z0-9-]*, at most 15"
    require_int SLIME_SLURM_CTLD_PORT "$CTLD_PORT" 1024 65535
    require_int SLIME_SLURM_FIRST_JOB_ID "$FIRST_JOB" 1 60000000
    if [[ $NAME != slime ]]; then  # a second cluster must not share anything with the default one
        [[ $PREFIX != sn && $NET != 10.77.0 && $CTLD_PORT != 6817 && $STATE != /var/lib/slime-slurm &&
            $CONF_DIR != /etc/slurm && $BRIDGE != slimebr0 ]] ||
            die "cluster '$NAME' needs its own SLIME_SLURM_NODE_PREFIX, _SUBNET, _CTLD_PORT, _STATE_DIR," \
                "_CONF_DIR and _BRIDGE (the default cluster uses sn, 10.77.0, 6817, /var/lib/slime-slurm," \
                "/etc/slurm, slimebr0)"
    fi
}

node_name() { printf '%s%d' "$PREFIX" "$1"; }
node_ip() { printf '%s.%d' "$NET" $((10 + $1)); }
node_list() { if ((NODES == 1)); then echo "${PREFIX}1"; else echo "$PREFIX[1-$NODES]"; fi; }

# ---------------------------------------------------------------- packages, munge
have_packages() {
    local bin
    for bin in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged \
        /usr/bin/munge /usr/bin/unmunge /usr/bin/nsenter /usr/bin/unshare /usr/bin/flock; do
        [[ -x $bin ]] || return 1
    done
    command -v ip >/dev/null && command -v ps >/dev/null
}

ensure_packages() {
    have_packages && return 0
    command -v apt-get >/dev/null ||
        die "SLURM/munge tools are missing and apt-get is not available: install ${PACKAGES[*]}"
    log "installing ${PACKAGES[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
    have_packages || die "packages installed but SLURM/munge binaries are still missing"
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
    munge_ok && return 0
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        install -d -o munge -g munge -m0700 /etc/munge
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m0755 /run/munge
    # setsid/setpriv exec in place, so $! is munged itself; --force: no working munged exists
    # (munge_ok failed), so a stale socket left by a dead one may be replaced.
    setsid setpriv --reuid=munge --regid=munge --init-groups \
        /usr/sbin/munged --foreground --force </dev/null >>"$STATE/log/munged.log" 2>&1 9>&- &
    record_pid munged $!
    local i
    for ((i = 0; i < 100; i++)); do munge_ok && return 0; sleep 0.1; done
    tail -n 20 "$STATE/log/munged.log" >&2 || true
    die "munged did not start (log: $STATE/log/munged.log)"
}

# ---------------------------------------------------------------- PIDs we started
# pids/NAME holds "PID STARTTIME"; a PID only counts as ours while its start time matches,
# so a recycled PID is never signalled.
# Zombies count as gone (their parent, often init, may reap them late).
proc_start() {
    local f
    f=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $f && ${f:0:1} != Z ]] || return 1
    cut -d' ' -f20 <<<"$f"
}

record_pid() {
    local st
    st=$(proc_start "$2") || die "process $1 (pid $2) exited right after start; see $STATE/log/"
    echo "$2 $st" >"$STATE/pids/$1"
}

pid_of() {  # prints the PID if the recorded process is still alive
    local f="$STATE/pids/$1" pid st now
    [[ -r $f ]] || return 1
    read -r pid st <"$f" || return 1
    now=$(proc_start "$pid" 2>/dev/null) || return 1
    [[ $now == "$st" ]] && echo "$pid"
}

term_recorded() {
    local pid
    if pid=$(pid_of "$1"); then kill -TERM "$pid" 2>/dev/null || true; fi
}

await_recorded() {  # name grace_seconds: wait for exit, KILL after the grace period
    local pid i
    for ((i = 0; i < $2 * 10; i++)); do
        pid_of "$1" >/dev/null || break
        sleep 0.1
    done
    if pid=$(pid_of "$1"); then
        log "$1 (pid $pid) ignored TERM for $2 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/pids/$1"
}

# ---------------------------------------------------------------- config
render_slurm_conf() {
    local i gres="" extra=""  # extra: only a second cluster's lines (the default config stays as it was)
    if ((GPUS > 0)); then gres=" Gres=gpu:${GPU_TYPE:+$GPU_TYPE:}$GPUS"; fi
    if ((CTLD_PORT != 6817)); then extra+=$'\n'"SlurmctldPort=$CTLD_PORT"; fi
    if ((FIRST_JOB != 1)); then extra+=$'\n'"FirstJobId=$FIRST_JOB"; fi
    cat <<EOF
$CONF_MARK
ClusterName=$NAME
SlurmctldHost=$(hostname -s)($NET.1)${extra}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.log
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
MinJobAge=3600
MaxArraySize=$MAX_ARRAY
MaxJobCount=$((MAX_ARRAY + 10000))
SchedulerParameters=bf_interval=1,sched_interval=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
KillWait=5
SlurmdTimeout=30
InactiveLimit=0
EOF
    for ((i = 1; i <= NODES; i++)); do
        echo "NodeName=$(node_name "$i") NodeAddr=$(node_ip "$i") NodeHostname=$(node_name "$i") CPUs=$CPUS RealMemory=$MEM${gres} State=UNKNOWN"
    done
    echo "PartitionName=batch Nodes=$(node_list) Default=YES PriorityTier=1 GraceTime=$PREEMPT_GRACE MaxTime=INFINITE State=UP"
    echo "PartitionName=urgent Nodes=$(node_list) PriorityTier=10 MaxTime=INFINITE State=UP"
}

render_gres_conf() {
    local i
    echo "$CONF_MARK"
    echo "AutoDetect=off"
    ((GPUS > 0)) || return 0
    for ((i = 1; i <= NODES; i++)); do
        echo "NodeName=$(node_name "$i") Name=gpu${GPU_TYPE:+ Type=$GPU_TYPE} File=$STATE/dev/$(node_name "$i")-gpu[0-$((GPUS - 1))]"
    done
}

# install_conf NAME CONTENT: writes /etc/slurm/NAME, keeping a foreign previous file for `down`.
# Returns 0 when the file changed.
install_conf() {
    local dst="$CONF_DIR/$1"
    if [[ -e $dst ]] && ! grep -qxF "$CONF_MARK" "$dst"; then
        [[ -e $STATE/backup/$1 ]] || cp -p "$dst" "$STATE/backup/$1"
    fi
    if [[ -e $dst ]] && [[ $(cat "$dst") == "$2" ]]; then return 1; fi
    printf '%s\n' "$2" >"$dst"
    return 0
}

conf_is_current() {
    [[ -r $CONF_DIR/slurm.conf && -r $CONF_DIR/gres.conf ]] &&
        [[ $(cat "$CONF_DIR/slurm.conf") == "$(render_slurm_conf)" ]] &&
        [[ $(cat "$CONF_DIR/gres.conf") == "$(render_gres_conf)" ]]
}

restore_conf() {
    local dst="$CONF_DIR/$1"
    if [[ -e $dst ]] && grep -qxF "$CONF_MARK" "$dst"; then rm -f "$dst"; fi
    if [[ -e $STATE/backup/$1 ]]; then
        mv -f "$STATE/backup/$1" "$dst"
        log "restored previous $dst"
    fi
}

# settings that need a rebuild (not just a repair) when they change
cluster_env() {
    printf 'NODES=%s\nNET=%s\nCPUS=%s\nGPUS=%s\nMEM=%s\nMAX_ARRAY=%s\n' \
        "$NODES" "$NET" "$CPUS" "$GPUS" "$MEM" "$MAX_ARRAY"
    # only when set, so a cluster brought up before this variable existed is not rebuilt for it
    if [[ -n $GPU_TYPE ]]; then printf 'GPU_TYPE=%s\n' "$GPU_TYPE"; fi
    # a second cluster's names, so that its status/down can never act on the default cluster's
    if [[ $NAME != slime || $PREFIX != sn || $BRIDGE != slimebr0 || $CONF_DIR != /etc/slurm ||
        $CTLD_PORT != 6817 || $FIRST_JOB != 1 ]]; then
        printf 'NAME=%s\nPREFIX=%s\nBRIDGE=%s\nCONF_DIR=%s\nCTLD_PORT=%s\nFIRST_JOB=%s\n' \
            "$NAME" "$PREFIX" "$BRIDGE" "$CONF_DIR" "$CTLD_PORT" "$FIRST_JOB"
    fi
}

load_recorded_env() {  # makes down/status use what up recorded, not the caller's env
    local f="$STATE/cluster.env" k v
    [[ -r $f ]] || return 1
    NAME=slime PREFIX=sn BRIDGE=slimebr0 CONF_DIR=/etc/slurm CTLD_PORT=6817 FIRST_JOB=1  # unless recorded
    while IFS='=' read -r k v; do
        case $k in
        NODES) NODES=$v ;; NET) NET=$v ;; CPUS) CPUS=$v ;;
        GPUS) GPUS=$v ;; MEM) MEM=$v ;; MAX_ARRAY) MAX_ARRAY=$v ;; GPU_TYPE) GPU_TYPE=$v ;;
        NAME) NAME=$v ;; PREFIX) PREFIX=$v ;; BRIDGE) BRIDGE=$v ;;
        CONF_DIR) CONF_DIR=$v ;; CTLD_PORT) CTLD_PORT=$v ;; FIRST_JOB) FIRST_JOB=$v ;;
        esac
    done <"$f"
    derive_names
}

# ---------------------------------------------------------------- /etc/hosts
hosts_without_block() {
    awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' /etc/hosts
}

write_hosts() {  # rewrite in place: /etc/hosts may be a bind mount that cannot be renamed over
    local content i
    content=$(hosts_without_block)
    {
        printf '%s\n%s\n' "$content" "$HOSTS_BEGIN"
        for ((i = 1; i <= NODES; i++)); do printf '%s %s\n' "$(node_ip "$i")" "$(node_name "$i")"; done
        printf '%s\n' "$HOSTS_END"
    } >"$STATE/hosts.new"
    cmp -s "$STATE/hosts.new" /etc/hosts || cat "$STATE/hosts.new" >/etc/hosts
    rm -f "$STATE/hosts.new"
}

remove_hosts_block() {
    local content
    grep -qxF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
    content=$(hosts_without_block)
    printf '%s\n' "$content" >/etc/hosts
}

# ---------------------------------------------------------------- network
check_subnet_free() {
    local conflict
    conflict=$(ip -4 route show to "$NET.0/24" | grep -v "dev $BRIDGE" || true)
    [[ -z $conflict ]] ||
        die "subnet $NET.0/24 is already routed here ($conflict); set SLIME_SLURM_SUBNET to a free one"
}

ensure_network() {
    local i n ip
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= NODES; i++)); do
        n=$(node_name "$i")
        ip=$(node_ip "$i")
        [[ -e /run/netns/$n ]] || ip netns add "$n"
        if ! ip -n "$n" link show eth0 >/dev/null 2>&1; then
            ip link del "slime-$n" 2>/dev/null || true
            ip link add "slime-$n" type veth peer name eth0 netns "$n"
        fi
        ip link set "slime-$n" master "$BRIDGE" up
        ip -n "$n" addr replace "$ip/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
    done
}

remove_network() {
    local i n
    for ((i = 1; i <= NODES; i++)); do
        n=$(node_name "$i")
        ip link del "slime-$n" 2>/dev/null || true
        if [[ -e /run/netns/$n ]]; then ip netns del "$n" || log "could not delete netns $n"; fi
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

# ---------------------------------------------------------------- daemons
ensure_dirs() {
    local i
    install -d -m0755 "$STATE" "$STATE/log" "$STATE/pids" "$STATE/run" "$STATE/ctld" \
        "$STATE/spool" "$STATE/dev" "$STATE/backup"
    if [[ ! -d $CONF_DIR ]]; then
        install -d -m0755 "$CONF_DIR"
        touch "$STATE/created-conf-dir"  # so `down` removes it again
    fi
    for ((i = 1; i <= NODES; i++)); do
        install -d -m0755 "$STATE/spool/$(node_name "$i")"
        local g
        for ((g = 0; g < GPUS; g++)); do
            local dev
            dev="$STATE/dev/$(node_name "$i")-gpu$g"
            [[ -c $dev ]] || mknod -m666 "$dev" c 1 3
        done
    done
    touch "$STATE/jobcomp.log"
}

ctld_ok() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

ensure_ctld() {
    pid_of slurmctld >/dev/null && return 0
    log "starting slurmctld"
    setsid /usr/sbin/slurmctld -D </dev/null >>"$STATE/log/slurmctld.out" 2>&1 9>&- &
    record_pid slurmctld $!
    local i
    for ((i = 0; i < 100; i++)); do
        ctld_ok && return 0
        pid_of slurmctld >/dev/null || break
        sleep 0.1
    done
    show_logs
    die "slurmctld did not come up"
}

node_init_pid() {  # PID (root namespace) of the node's PID-1 wrapper: the unshare process's child
    local upid
    upid=$(pid_of "$1") || return 1
    ps -o pid= --ppid "$upid" | awk 'NR==1{print $1}'
}

ensure_node() {
    local n=$1 i
    pid_of "$n" >/dev/null && return 0
    log "starting node $n"
    # nsenter and unshare exec in place, so $! is the unshare process; its child is PID 1 of
    # the node (node-init.pl). Not `ip netns exec`: that remounts /sys and slurmd then fails.
    setsid nsenter --net="/run/netns/$n" \
        unshare --uts --pid --fork --mount-proc --kill-child \
        /usr/bin/perl "$NODE_INIT" "$n" /usr/sbin/slurmd -D -N "$n" \
        </dev/null >>"$STATE/log/node-$n.out" 2>&1 9>&- &
    record_pid "$n" $!
    for ((i = 0; i < 50; i++)); do
        [[ -n $(node_init_pid "$n") ]] && return 0
        sleep 0.1
    done
    die "node $n did not start (log: $STATE/log/node-$n.out)"
}

term_nodes() {  # TERM each node's init, which forwards it to slurmd
    local i n init
    for ((i = 1; i <= NODES; i++)); do
        n=$(node_name "$i")
        if init=$(node_init_pid "$n") && [[ -n $init ]]; then
            echo "$init" >"$STATE/pids/$n.init"
            kill -TERM "$init" 2>/dev/null || true
        fi
    done
}

await_nodes() {
    local i j n left
    for ((i = 0; i < 100; i++)); do
        left=0
        for ((j = 1; j <= NODES; j++)); do pid_of "$(node_name "$j")" >/dev/null && left=1; done
        ((left)) || break
        sleep 0.1
    done
    for ((i = 1; i <= NODES; i++)); do
        n=$(node_name "$i")
        # killing a PID namespace's init kills everything in that namespace
        if pid_of "$n" >/dev/null && [[ -r $STATE/pids/$n.init ]]; then
            log "node $n ignored TERM for 10 s; killing it"
            kill -KILL "$(cat "$STATE/pids/$n.init")" 2>/dev/null || true
        fi
        rm -f "$STATE/pids/$n.init"
        await_recorded "$n" 5
    done
}

# stop_daemons [munge]: everything at once (each takes ~2 s to exit), munged only if asked
# and only if this script started it.
stop_daemons() {
    [[ -d $STATE/pids ]] || return 0
    term_nodes
    term_recorded slurmctld
    if [[ ${1:-} == munge ]]; then term_recorded munged; fi
    await_nodes
    await_recorded slurmctld 15
    if [[ ${1:-} == munge ]]; then await_recorded munged 5; fi
}

# ---------------------------------------------------------------- health
node_states() { sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }

usable_state() { [[ $1 =~ ^(idle|allocated|mixed|completing)$ ]]; }

# prints problems, one per line; no output = healthy
health_problems() {
    local i n st
    [[ -r $STATE/cluster.env ]] || { echo "no cluster recorded in $STATE (run: $0 up)"; return; }
    munge_ok || echo "munge does not work"
    if [[ $EUID -eq 0 ]]; then
        pid_of slurmctld >/dev/null || echo "slurmctld (started by this script) is not running"
        for ((i = 1; i <= NODES; i++)); do
            n=$(node_name "$i")
            pid_of "$n" >/dev/null || echo "node $n is not running"
        done
    fi
    if ! ctld_ok; then echo "slurmctld does not answer (scontrol ping)"; return; fi
    for ((i = 1; i <= NODES; i++)); do
        n=$(node_name "$i")
        st=$(node_states | awk -v n="$n" '$1==n{print $2}')
        usable_state "$st" || echo "node $n is '${st:-missing}'"
    done
}

show_logs() {
    local f
    for f in "$STATE"/log/slurmctld.log "$STATE"/log/slurmd-*.log "$STATE"/log/*.out "$STATE"/log/munged.log; do
        [[ -s $f ]] || continue
        log "---- $f (errors, then last lines)"
        # known noise: Debian's slurm probes PMIx (not installed; MpiDefault=none) and a fresh
        # state dir has no saved state yet
        grep -iE 'error|fatal' "$f" | grep -vE 'pmix|MPI: Cannot create context|state file|NOTE: Trying backup' |
            tail -n 15 >&2 || true
        tail -n 15 "$f" >&2
    done
}

summary() {
    local i
    echo "SLURM cluster is up (state: $STATE, config: $CONF_DIR/slurm.conf)"
    for ((i = 1; i <= NODES; i++)); do
        printf '  node %-5s %-15s %d CPUs, %d fake GPUs\n' "$(node_name "$i")" "$(node_ip "$i")" "$CPUS" "$GPUS"
    done
    echo "  login node (this namespace): $NET.1 on bridge $BRIDGE"
    echo "  partitions: batch (default, PriorityTier=1), urgent (PriorityTier=10, preempts batch by requeue)"
    echo "  logs: $STATE/log/   job completion log: $STATE/jobcomp.log (sacct -c)"
    sinfo
}

wait_usable() {
    local deadline=$((SECONDS + UP_TIMEOUT)) i n st all resumed=" "
    while :; do
        all=1
        for ((i = 1; i <= NODES; i++)); do
            n=$(node_name "$i")
            st=$(node_states | awk -v n="$n" '$1==n{print $2}')
            usable_state "$st" && continue
            all=0
            # A drain (or a down that ReturnToService does not lift) survives restarts: once
            # the node answers again (no trailing '*'), resume it, once per `up`.
            if [[ $st =~ ^(drained|draining|drain|down)$ && $resumed != *" $n "* ]]; then
                log "resuming node $n (was $st)"
                scontrol update nodename="$n" state=resume || true
                resumed+="$n "
            fi
        done
        ((all)) && return 0
        if ((SECONDS >= deadline)); then
            node_states >&2 || true
            scontrol show node -o >&2 || true
            show_logs
            die "nodes not usable after ${UP_TIMEOUT}s"
        fi
        sleep 0.2
    done
}

# ---------------------------------------------------------------- commands
cmd_up() {
    [[ $EUID -eq 0 ]] || die "'up' needs root (network namespaces, mknod, /etc/hosts)"
    validate_env
    [[ -r $NODE_INIT ]] || die "missing $NODE_INIT"
    ensure_packages
    local want problems
    want=$(cluster_env)
    local recorded
    recorded=$(sed -n 's/^NAME=//p' "$STATE/cluster.env" 2>/dev/null || true)
    [[ ! -r $STATE/cluster.env || ${recorded:-slime} == "$NAME" ]] ||
        die "$STATE holds cluster '${recorded:-slime}', not '$NAME': set SLIME_SLURM_STATE_DIR to its own dir"
    if [[ -r $STATE/cluster.env ]] && [[ $(cat "$STATE/cluster.env") != "$want" ]]; then
        log "settings changed since the last 'up': rebuilding the cluster"
        (cmd_down)  # subshell: down loads the recorded settings, which must not replace ours
    fi
    if [[ -r $STATE/cluster.env ]]; then
        problems=$(health_problems)
        conf_is_current || problems+="${problems:+$'\n'}config in $CONF_DIR differs from this script's"
        if [[ -z $problems ]]; then
            log "already up and healthy: nothing to do"
            summary
            return 0
        fi
        log "repairing: ${problems//$'\n'/; }"
    fi
    check_subnet_free
    ensure_dirs
    printf '%s\n' "$want" >"$STATE/cluster.env"  # recorded before anything else, for `down`
    ensure_munge
    local changed=0 i
    install_conf slurm.conf "$(render_slurm_conf)" && changed=1
    install_conf gres.conf "$(render_gres_conf)" && changed=1
    if ((changed)); then   # daemons must re-read it; cheap, and only after a config change
        stop_daemons
    fi
    write_hosts
    ensure_network
    ensure_ctld
    for ((i = 1; i <= NODES; i++)); do ensure_node "$(node_name "$i")"; done
    wait_usable
    summary
}

cmd_down() {
    [[ $EUID -eq 0 ]] || die "'down' needs root"
    if ! load_recorded_env; then
        log "no cluster recorded in $STATE; removing leftovers only"
        validate_env
    fi
    stop_daemons munge
    remove_network
    remove_hosts_block
    if [[ -d $STATE/backup ]] || [[ -d $CONF_DIR ]]; then
        restore_conf slurm.conf
        restore_conf gres.conf
    fi
    if [[ -e $STATE/created-conf-dir ]]; then rmdir "$CONF_DIR" 2>/dev/null || true; fi
    if [[ ${SLIME_SLURM_KEEP_LOGS:-0} == 1 ]]; then
        find "$STATE" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
        log "logs kept in $STATE/log"
    else
        rm -rf "$STATE"
    fi
    log "down: cluster removed"
}

cmd_status() {
    load_recorded_env || true
    local problems
    problems=$(health_problems)
    sinfo 2>/dev/null || true
    if [[ -n $problems ]]; then
        printf 'unhealthy: %s\n' "$problems" >&2
        return 1
    fi
    echo "healthy: $NODES nodes, state $STATE"
}

main() {
    local cmd=${1:-}
    case $cmd in
    up | down)
        # The daemons must not inherit a caller's descriptors: one holding a lock (a test run under
        # `flock FILE ...`) would keep that lock taken for the cluster's lifetime. 255: bash reads us there.
        local fd
        for fd in /proc/$$/fd/*; do
            fd=${fd##*/}
            if ((fd > 2 && fd < 255)); then eval "exec $fd>&-"; fi
        done
        # one up/down at a time (several test sessions may race to start the cluster)
        mkdir -p "$(dirname "$LOCK_FILE")"
        exec 9>"$LOCK_FILE"  # daemons are started with 9>&- so they do not inherit the lock
        flock -w 300 9 || die "another '$0' holds $LOCK_FILE for over 300 s"
        "cmd_$cmd"
        ;;
    status) cmd_status ;;
    config)
        validate_env
        printf '# ---- %s/slurm.conf\n%s\n# ---- %s/gres.conf\n%s\n' \
            "$CONF_DIR" "$(render_slurm_conf)" "$CONF_DIR" "$(render_gres_conf)"
        ;;
    *)
        echo "usage: $0 up|down|status|config" >&2
        exit 2
        ;;
    esac
}

# sourced (tests/unit/test_slurm_cluster_script.py): define the functions only
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi
