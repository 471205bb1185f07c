package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// EnvFuzzWorkerLogs names a directory where fuzzing worker processes
// write their standard error (CaptureFuzzWorkerOutput); scripts/fuzz sets
// it.
const EnvFuzzWorkerLogs = "MICROVM_FUZZ_WORKER_LOGS"

// CaptureFuzzWorkerOutput, called from a fuzzing package's TestMain, makes
// a fuzzing worker process keep its last words. go test -fuzz runs the
// target in worker processes (-test.fuzzworker) whose output it discards,
// so a worker that dies (a panic on a goroutine of its own, a fatal
// runtime error, or the fuzzer's own limit of 10 s per execution, which
// panics "deadlocked!") is reported only as "fuzzing process hung or
// terminated unexpectedly". When $MICROVM_FUZZ_WORKER_LOGS names a
// directory, a worker's file descriptor 2 goes to DIR/worker-PID.log
// instead; with GOTRACEBACK=all the panic there carries every goroutine's
// stack. Anything else (the coordinator, a plain go test) is left alone.
func CaptureFuzzWorkerOutput() {
	dir := os.Getenv(EnvFuzzWorkerLogs)
	if dir == "" || !isFuzzWorker(os.Args) {
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("worker-%d.log", os.Getpid())), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return // the directory is gone: nothing to keep the words in
	}
	_ = unix.Dup3(int(f.Fd()), 2, 0)
	f.Close()
}

// isFuzzWorker says whether args are a fuzzing worker's.
func isFuzzWorker(args []string) bool {
	for _, a := range args[1:] {
		if a == "-test.fuzzworker" || strings.HasPrefix(a, "-test.fuzzworker=") {
			return true
		}
	}
	return false
}
