package dockervm

// The guest side: each step is one sh -c script run through the Runner,
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
const probeScript = sbinPath + `for p in dockerd docker setsid mount; do
	command -v "$p" >/dev/null 2>&1 || { echo "$p"; exit 3; }
done
`

// pingScript ($1: the pid file) prints the server's version and exits 0
// when the daemon answers; it exits 4 when dockerd is gone, 1 otherwise.
const pingScript = sbinPath + `docker version --format '{{.Server.Version}}' 2>&1 && exit 0
pid=$(cat "$1" 2>/dev/null) || exit 1
kill -0 "$pid" 2>/dev/null || exit 4
exit 1
`

// mountScript ($1: the serial, $2: the directory) mounts the virtio disk
// whose serial is $1 at $2, unless it is mounted there already.
const mountScript = sbinPath + `dev=
for s in /sys/block/*/serial; do
	[ -r "$s" ] || continue
	if [ "$(cat "$s")" = "$1" ]; then d=${s%/serial}; dev=/dev/${d##*/}; fi
done
[ -n "$dev" ] || { echo "no disk with serial $1 in the guest"; exit 1; }
grep -q "^$dev $2 " /proc/mounts && exit 0
mkdir -p "$2" && mount -t ext4 "$dev" "$2"
`

// startScript ($1: the pid file, $2: the log, then dockerd's arguments)
// starts dockerd in a session of its own, detached from the agent's
// process group, which the agent kills when this script exits. It returns
// once the new session's shell has written its pid, that is, once setsid
// has run: the wait is a few milliseconds, bounded at ten seconds.
const startScript = sbinPath + `pidf=$1 log=$2
shift 2
rm -f "$pidf"
mkdir -p "${log%/*}"
setsid sh -c 'echo $$ >"$0.new" && mv "$0.new" "$0" && exec dockerd "$@"' "$pidf" "$@" </dev/null >>"$log" 2>&1 &
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
