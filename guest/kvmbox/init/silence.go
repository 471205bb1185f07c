package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/testing/kvmbox"
)

// A box whose command goes silent is ended by the host after
// kvmbox.Options.QuietTimeout. Before that, at Job.QuietReport, the init
// writes to the console what every task of the L1 is waiting on, so the
// record says why (a lost 9p reply, a stuck virtio-serial port, a vCPU
// spinning in KVM_RUN), not only that.
//
// Owner: execute starts one watchSilence goroutine per command; it ends
// when done closes. The copiers stamp out (kvmbox.OutputClock).

// watchSilence calls report once per silence of at least after: then it
// waits for the command to print again before it can report again.
func watchSilence(out *kvmbox.OutputClock, after time.Duration, done <-chan struct{}, report func()) {
	t := time.NewTicker(min(after/4, 5*time.Second))
	defer t.Stop()
	var reported time.Time // the last output already reported on
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			l := out.Last()
			if !l.Equal(reported) && now.Sub(l) >= after {
				reported = l
				report()
			}
		}
	}
}

// idleWchan are waits a thread sits in when it has nothing to do: their
// kernel stacks are left out of the report.
var idleWchan = map[string]bool{
	"futex_wait_queue": true, "do_epoll_wait": true, "ep_poll": true,
	"do_nanosleep": true, "hrtimer_nanosleep": true, "do_wait": true,
	"do_sys_poll": true, "do_select": true, "kthread_worker_fn": true,
	"worker_thread": true, "rescuer_thread": true, "smpboot_thread_fn": true,
	"kthreadd": true,
}

// reportTasks writes, to the console, the kernel's own dumps of blocked
// tasks and of every CPU (sysrq w and l), then one line per thread (pid,
// tid, name, state, wait channel) with the kernel stack of every thread
// not idle.
func reportTasks(w io.Writer, after time.Duration) {
	fmt.Fprintf(w, "kvmbox-init: the command printed nothing for %v; what the L1's tasks wait on:\n", after)
	// The box boots with loglevel=4, which would keep the dumps (printed
	// at KERN_INFO) off the console: raised for them, then put back.
	const printk = "/proc/sys/kernel/printk"
	level := readSmall(printk)
	if level != "" {
		_ = os.WriteFile(printk, []byte("8"), 0)
	}
	for _, key := range []string{"w", "l"} {
		if err := os.WriteFile("/proc/sysrq-trigger", []byte(key), 0); err != nil {
			fmt.Fprintf(w, "kvmbox-init: sysrq %s: %v\n", key, err)
		}
	}
	if f := strings.Fields(level); len(f) > 0 {
		_ = os.WriteFile(printk, []byte(f[0]), 0)
	}
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		tids, _ := filepath.Glob(p + "/task/[0-9]*")
		for _, t := range tids {
			name, state := taskStat(t)
			wchan := strings.TrimSpace(readSmall(t + "/wchan"))
			fmt.Fprintf(w, "kvmbox-init: pid %s tid %s %s %s wchan %s\n",
				filepath.Base(p), filepath.Base(t), name, state, wchan)
			if state == "S" && idleWchan[wchan] || state == "I" {
				continue
			}
			for _, l := range strings.Split(strings.TrimSpace(readSmall(t+"/stack")), "\n") {
				if l != "" {
					fmt.Fprintf(w, "kvmbox-init:     %s\n", l)
				}
			}
		}
	}
	fmt.Fprintln(w, "kvmbox-init: end of the report")
}

// taskStat reads a thread's name and one-letter state from its stat file
// ("TID (NAME) S ...": the name may hold spaces and parentheses).
func taskStat(dir string) (name, state string) {
	s := readSmall(dir + "/stat")
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "?", "?"
	}
	rest := strings.Fields(s[end+1:])
	if len(rest) == 0 {
		return s[open+1 : end], "?"
	}
	return s[open+1 : end], rest[0]
}

// readSmall reads at most 16 KiB of a proc file; a thread that ended
// meanwhile reads as empty.
func readSmall(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var b bytes.Buffer
	_, _ = io.Copy(&b, io.LimitReader(f, 16<<10))
	return b.String()
}
