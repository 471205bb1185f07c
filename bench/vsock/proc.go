package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of the times in /proc/<pid>/stat. It is 100
// on every Linux architecture Go supports (sysconf(_SC_CLK_TCK) is fixed by
// the kernel ABI), so one tick is 10 ms.
const clockTick = 10 * time.Millisecond

// threadTimes are one thread's (or the whole process's) CPU times from
// /proc/.../stat, in clock ticks.
type threadTimes struct {
	utime, stime, guest uint64 // fields 14, 15 and 43 (guest_time, included in utime)
}

// cpu is utime+stime.
func (t threadTimes) cpu() uint64 { return t.utime + t.stime }

// parseStat extracts utime, stime and guest_time from a /proc stat line. The
// comm field (2) is in parentheses and may itself contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(line string) (threadTimes, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return threadTimes{}, errors.New("no ')' after comm")
	}
	// After ')' comes field 3 (state); fields[k] is field k+3.
	f := strings.Fields(line[i+1:])
	field := func(n int) (uint64, error) {
		if n-3 >= len(f) {
			return 0, fmt.Errorf("only %d fields", len(f)+2)
		}
		return strconv.ParseUint(f[n-3], 10, 64)
	}
	var t threadTimes
	var err error
	if t.utime, err = field(14); err != nil {
		return t, err
	}
	if t.stime, err = field(15); err != nil {
		return t, err
	}
	if t.guest, err = field(43); err != nil {
		return t, err
	}
	return t, nil
}

func readStat(path string) (threadTimes, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return threadTimes{}, err
	}
	t, err := parseStat(string(b))
	if err != nil {
		return t, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// procSnapshot is the CPU time of a process and of each of its live threads
// at one moment.
type procSnapshot struct {
	proc    threadTimes            // /proc/<pid>/stat: all threads, exited ones included
	threads map[string]threadTimes // tid -> /proc/<pid>/task/<tid>/stat
}

func snapshot(pid int) (procSnapshot, error) {
	dir := fmt.Sprintf("/proc/%d", pid)
	s := procSnapshot{threads: map[string]threadTimes{}}
	var err error
	if s.proc, err = readStat(filepath.Join(dir, "stat")); err != nil {
		return s, err
	}
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return s, err
	}
	for _, e := range tasks {
		t, err := readStat(filepath.Join(dir, "task", e.Name(), "stat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		s.threads[e.Name()] = t
	}
	return s, nil
}

// cpuUsage is what a process spent between two snapshots.
type cpuUsage struct {
	VMM      time.Duration // utime+stime of the whole process
	VCPU     time.Duration // utime+stime of the vCPU thread
	VCPUTID  string        // the vCPU thread
	VCPUHow  string        // how it was identified
	Guest    time.Duration // guest_time of the vCPU thread (part of VCPU)
	NThreads int
}

// usage computes what the process and its vCPU thread spent from a to b.
//
// The vCPU thread is the one whose guest_time (stat field 43) grew: the
// kernel charges time to guest_time only while a thread is inside KVM_RUN
// with the guest executing (PF_VCPU), so no other thread of a VMM can have
// any. The test guest has one vCPU. If no thread accrued guest time in the
// window (a run shorter than a tick), the thread with the largest
// guest_time overall is taken, and failing that the thread that used the
// most CPU in the window (reported as a guess).
func usage(a, b procSnapshot) cpuUsage {
	u := cpuUsage{VMM: ticks(b.proc.cpu() - a.proc.cpu()), NThreads: len(b.threads)}
	delta := func(tid string) (threadTimes, bool) {
		tb, ok := b.threads[tid]
		if !ok {
			return threadTimes{}, false
		}
		ta := a.threads[tid] // zero if the thread started in the window
		return threadTimes{tb.utime - ta.utime, tb.stime - ta.stime, tb.guest - ta.guest}, true
	}
	pick := func(score func(tid string) uint64) string {
		best, bestScore := "", uint64(0)
		for tid := range b.threads {
			if s := score(tid); s > bestScore || (s == bestScore && best != "" && tid < best) {
				best, bestScore = tid, s
			}
		}
		if bestScore == 0 {
			return ""
		}
		return best
	}
	tid, how := pick(func(t string) uint64 { d, _ := delta(t); return d.guest }), "guest_time grew"
	if tid == "" {
		tid, how = pick(func(t string) uint64 { return b.threads[t].guest }), "largest guest_time"
	}
	if tid == "" {
		tid, how = pick(func(t string) uint64 { d, _ := delta(t); return d.cpu() }), "guess: busiest thread"
	}
	if tid != "" {
		d, _ := delta(tid)
		u.VCPU, u.Guest, u.VCPUTID, u.VCPUHow = ticks(d.cpu()), ticks(d.guest), tid, how
	}
	return u
}

func ticks(n uint64) time.Duration { return time.Duration(n) * clockTick }
