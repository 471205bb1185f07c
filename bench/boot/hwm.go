package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Peak RSS, measured two ways.
//
// wait4's ru_maxrss, which the timed runs report, is the larger of the
// VMM's own peak and the peak of the memory the spawning process had before
// exec replaced it (Linux records the old mm's high-water mark at exec, and
// Go spawns with vfork, so that is this benchmark's own heap). It can
// therefore overstate a small VMM. hwmRun runs a VMM under ptrace with
// PTRACE_O_TRACEEXIT, stops it as it exits, while its memory still exists,
// and reads VmHWM from /proc/PID/status: the high-water mark of the
// memory the VMM's exec created, its own and nothing else. Those runs are
// not timed (every signal the VMM gets stops it for the tracer).

// hwmSample is one ptraced run: VmHWM at exit, and wait4's figure for the
// same run.
type hwmSample struct {
	HWMKiB  int64 `json:"vmhwm_kib"`
	WaitKiB int64 `json:"wait4_maxrss_kib"`
}

// hwmRun runs v once under ptrace and returns its VmHWM at exit. The
// output check of runOnce applies.
func hwmRun(v vmm, timeout time.Duration) (hwmSample, error) {
	// ptrace requests must come from the thread that started the
	// tracee.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	out, err := os.CreateTemp("", "bench-boot-out-")
	if err != nil {
		return hwmSample{}, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command(v.Argv[0], v.Argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out // files: no copying goroutines to wait for
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	if err := cmd.Start(); err != nil {
		return hwmSample{}, err
	}
	pid := cmd.Process.Pid
	timer := time.AfterFunc(timeout, func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	defer timer.Stop()

	var ws syscall.WaitStatus
	var ru syscall.Rusage
	// The tracee stops with SIGTRAP once exec is done.
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return hwmSample{}, fmt.Errorf("wait for exec: %w", err)
	}
	if !ws.Stopped() {
		return hwmSample{}, fmt.Errorf("not stopped after exec (%v)", ws)
	}
	if err := syscall.PtraceSetOptions(pid, syscall.PTRACE_O_TRACEEXIT); err != nil {
		return hwmSample{}, fmt.Errorf("PTRACE_SETOPTIONS: %w", err)
	}
	var s hwmSample
	sig := 0
	for {
		if err := syscall.PtraceCont(pid, sig); err != nil {
			return hwmSample{}, fmt.Errorf("PTRACE_CONT: %w", err)
		}
		if _, err := syscall.Wait4(pid, &ws, syscall.WALL, &ru); err != nil {
			return hwmSample{}, fmt.Errorf("wait: %w", err)
		}
		switch {
		case ws.Exited(), ws.Signaled():
			s.WaitKiB = ru.Maxrss
			return s, checkRun(v, ws, out.Name(), s.HWMKiB > 0)
		case ws.Stopped() && ws.StopSignal() == syscall.SIGTRAP && ws.TrapCause() == syscall.PTRACE_EVENT_EXIT:
			if s.HWMKiB, err = vmHWM(pid); err != nil {
				return hwmSample{}, err
			}
			sig = 0
		case ws.Stopped():
			sig = int(ws.StopSignal()) // deliver it: the VMM's own signals
		}
	}
}

// checkRun applies runOnce's checks to a finished ptraced run.
func checkRun(v vmm, ws syscall.WaitStatus, outPath string, sawExit bool) error {
	b, _ := os.ReadFile(outPath)
	switch {
	case ws.Signaled():
		return fmt.Errorf("killed by %v; output %q", ws.Signal(), tail(string(b)))
	case ws.ExitStatus() != v.WantStatus:
		return fmt.Errorf("exit status %d, want %d; output %q", ws.ExitStatus(), v.WantStatus, tail(string(b)))
	case !strings.Contains(string(b), v.WantOutput):
		return fmt.Errorf("no %q in the output %q", v.WantOutput, tail(string(b)))
	case !sawExit:
		return fmt.Errorf("exited without the ptrace exit stop")
	}
	return nil
}

// vmHWM reads VmHWM (KiB) from /proc/PID/status.
func vmHWM(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
