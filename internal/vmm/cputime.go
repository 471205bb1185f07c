package vmm

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// selfCPUTime is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
func selfCPUTime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_THREAD_CPUTIME_ID): %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// threadCPUTime is the CPU time of thread tid of this process: its
// scheduler clock, which clock_gettime reads for any thread of the caller's
// thread group through the clock id Linux builds with
// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) (include/linux/posix-timers_types.h:
// ~tid << 3, per-thread bit 4, CPUCLOCK_SCHED 2), as glibc's
// pthread_getcpuclockid does. One system call, at scrape time only.
func threadCPUTime(tid int) (time.Duration, error) {
	const perThread, sched = 4, 2
	clk := (^int32(tid))<<3 | perThread | sched
	var ts unix.Timespec
	if err := unix.ClockGettime(clk, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(thread %d): %w", tid, err)
	}
	return time.Duration(ts.Nano()), nil
}
