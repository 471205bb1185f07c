package dockervm

// The guest side: each step is one sh -c script run through the agentvm.Runner,
// its variable parts passed as arguments ($1...), never spliced into the
// script. The scripts need only POSIX sh and the programs probe checks
// for, plus cat, mkdir, grep, kill, rm, sleep and tail.

// Where things are in the guest.
const (
	// DataRoot is where the data disk is mounted: dockerd's default
	// --data-root.
	DataRoot = "/var/lib/docker"
	// LogPath takes dockerd's output (and its containerd's).
	LogPath = "/var/log/dockerd.log"
	// pidPath holds dockerd's pid while it runs.
	pidPath = "/run/microvm-dockerd.pid"
	// dockerSocket is where dockerd serves its API by default, and where
	// the docker client looks.
	dockerSocket = "/var/run/docker.sock"
	// containerdSocket is where the containerd Start starts listens, and
	// where dockerd finds it.
	containerdSocket = "/run/containerd/containerd.sock"
)

// sbinPath appends the sbin directories, where Debian keeps dockerd and
// mount, to a PATH the image may have set without them.
const sbinPath = `PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}:/usr/local/sbin:/usr/sbin:/sbin"; export PATH
`

// Exit statuses the scripts give for what Start tells apart; any other
// non-zero status is "not yet" (ping) or a failure with the output as its
// reason.
const (
	// statusMissing: probe found a program missing; its output names it.
	statusMissing = 3
	// statusExited: ping found no daemon answering and dockerd gone.
	statusExited = 4
)

// probeScript checks that the image has what Start runs.
const probeScript = sbinPath + `for p in dockerd docker containerd setsid mount; do
	command -v "$p" >/dev/null 2>&1 || { echo "$p"; exit 3; }
done
`

// pingScript ($1: the pid file, $2: dockerd's socket) prints the server's
// version and exits 0 when the daemon answers; it exits 4 when dockerd is
// gone, 1 otherwise. The docker client is asked only once the socket
// exists (dockerd makes it last, when its API listens): the client is a
// large Go program whose every start costs a slow guest a second or more
// of a vCPU, which the daemon starting beside it needs.
const pingScript = sbinPath + `[ -S "$2" ] && docker version --format '{{.Server.Version}}' 2>&1 && exit 0
pid=$(cat "$1" 2>/dev/null) || exit 1
kill -0 "$pid" 2>/dev/null || exit 4
exit 1
`

// startScript ($1: the pid file, $2: the log, $3: containerd's socket,
// then dockerd's arguments) starts containerd and then dockerd, pointed at
// it, in a session of their own, detached from the agent's process group,
// which the agent kills when this script exits. The session's shell writes
// its pid, which dockerd keeps (exec), and containerd's beside it
// ($1.containerd). dockerd is started only once containerd listens, that
// is, once its socket exists (a stale one is removed first; containerd
// makes it after loading its plugins): dockerd's own wait for a containerd
// it starts itself is short and fixed, and containerd reopening a data
// root takes longer than that where the guest is slow (the nested-KVM
// box); the host's wait (Options.Timeout) bounds this one. (Asking with
// ctr version, as before, cost a slow guest the start of one more large Go
// program, 23 MB read from the image first: in the box a cold start of
// such a program took seconds, dockerd --version 6.3 s cold and 2.2 s
// warm.) The script returns once the pid is written, that is, once setsid
// has run: a few milliseconds, bounded at ten seconds.
const startScript = sbinPath + `pidf=$1 log=$2 sock=$3
shift 3
rm -f "$pidf" "$pidf.containerd" "$sock"
mkdir -p "${log%/*}"
setsid sh -c '
echo $$ >"$0.new" && mv "$0.new" "$0" || exit 1
sock=$1
shift
containerd --address "$sock" &
echo $! >"$0.containerd"
i=0
until [ -e "$sock" ]; do
	kill -0 "$(cat "$0.containerd")" 2>/dev/null || { echo "microvm: containerd exited before it listened"; exit 1; }
	i=$((i + 1))
	[ "$i" -le 6000 ] || { echo "microvm: containerd did not listen within 10m"; exit 1; }
	sleep 0.1
done
exec dockerd --containerd="$sock" "$@"
' "$pidf" "$sock" "$@" </dev/null >>"$log" 2>&1 &
i=0
while [ ! -s "$pidf" ]; do
	i=$((i + 1))
	[ "$i" -le 1000 ] || { echo "dockerd did not start: no pid in $pidf after 10s"; exit 1; }
	sleep 0.01
done
`

// tailScript ($1: the log) prints the log's last lines.
const tailScript = `tail -n 20 "$1" 2>&1
`

// stopScript ($1: the pid file) stops the dockerd Start started, then its
// containerd, and waits for each to end, so that nothing holds the data
// root open: dockerd stops its containers first (their stop timeout, ten
// seconds by default). It exits 0 when none was running, 1 when one
// outlived the wait.
const stopScript = `stop() {
	pid=$(cat "$1" 2>/dev/null) || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	i=0
	while kill -0 "$pid" 2>/dev/null; do
		i=$((i + 1))
		[ "$i" -le 3000 ] || { echo "$2 did not stop within 30s of SIGTERM"; exit 1; }
		sleep 0.01
	done
}
stop "$1" dockerd
stop "$1.containerd" containerd
`
