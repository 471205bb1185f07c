package dockervm

import "strings"

// ExitStatus is what exec, run and the executors exit with when Docker
// did not start in the guest (an *Error): neither the command's status
// nor microvm's own 125, and not one that timeout(1) (124), xargs (123)
// or a shell (126, 127, 128+N) gives.
const ExitStatus = 122

// Error is Docker's failure to start in the guest: an image without
// dockerd, a data disk that did not mount, a daemon that exited or did not
// answer in time. Callers find it with errors.As and exit with ExitStatus.
type Error struct {
	// Reason is one line: what went wrong and what to do.
	Reason string
	// Log is the end of /var/log/dockerd.log (at most logLines lines of
	// at most logLineBytes bytes each), or empty.
	Log string
}

func (e *Error) Error() string {
	if e.Log == "" {
		return "docker: " + e.Reason
	}
	return "docker: " + e.Reason + "; the end of " + LogPath + ":\n" + e.Log
}

// Bounds on the dockerd log an Error carries.
const (
	logLines     = 20
	logLineBytes = 256
)

// logTail keeps the last logLines non-empty lines of s, each cut to
// logLineBytes and indented, so that a log of any size gives a short
// message.
func logTail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	var keep []string
	for i := len(lines) - 1; i >= 0 && len(keep) < logLines; i-- {
		l := strings.TrimRight(lines[i], "\r")
		if strings.TrimSpace(l) == "" {
			continue
		}
		if len(l) > logLineBytes {
			l = l[:logLineBytes] + "..."
		}
		keep = append(keep, "  "+l)
	}
	for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
		keep[i], keep[j] = keep[j], keep[i]
	}
	return strings.Join(keep, "\n")
}
