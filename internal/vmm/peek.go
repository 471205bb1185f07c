package vmm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/microvm/microvm/kvm"
)

// Peeking at the vCPUs of a running machine (PeekVCPUs), for a post-mortem
// of a guest that stopped making progress: where each vCPU's instruction
// pointer is, and whether it is halted waiting for an interrupt or running.
// KVM wants a vCPU's registers read by the thread that runs it, so the
// caller publishes a request and kicks every vCPU out of KVM_RUN; each vCPU
// goroutine, at the top of its loop (between two exits, never inside one),
// answers the request once and enters the guest again. The guest loses a
// few microseconds; nothing else changes (unlike Pause, which holds the
// vCPUs until Resume).
//
// Ownership: peekMu (a leaf, held by the caller across one whole request)
// serializes callers; the current request is published in peekReq (an
// atomic pointer, read by the vCPU goroutines without a lock); each
// request's answers are guarded by its own mutex. No system call is made
// under either lock, except the register reads a vCPU does for its answer,
// under no lock.

// VCPUInfo is where one vCPU stood when PeekVCPUs asked.
type VCPUInfo struct {
	ID      int
	RIP     uint64
	RSP     uint64
	RFLAGS  uint64
	CR3     uint64
	MPState uint32 // kvm.MPState*: halted means waiting for an interrupt
}

// String is one line: "vCPU 0 rip=0xffffffff81a0c4d2 rsp=... rflags=0x246
// (IF) cr3=0x... halted".
func (i VCPUInfo) String() string {
	const rflagsIF = 1 << 9
	intr := "IF clear"
	if i.RFLAGS&rflagsIF != 0 {
		intr = "IF"
	}
	return fmt.Sprintf("vCPU %d rip=%#x rsp=%#x rflags=%#x (%s) cr3=%#x %s",
		i.ID, i.RIP, i.RSP, i.RFLAGS, intr, i.CR3, mpStateName(i.MPState))
}

// mpStateName names a KVM_MP_STATE_* value.
func mpStateName(s uint32) string {
	switch s {
	case kvm.MPStateRunnable:
		return "runnable"
	case kvm.MPStateUninitialized:
		return "uninitialized (waiting for INIT/SIPI)"
	case kvm.MPStateInitReceived:
		return "INIT received"
	case kvm.MPStateHalted:
		return "halted"
	case kvm.MPStateSIPIReceived:
		return "SIPI received"
	}
	return fmt.Sprintf("mp_state %d", s)
}

// peekRequest is one PeekVCPUs call: the answers so far, and done, closed
// when every vCPU answered.
type peekRequest struct {
	mu      sync.Mutex
	answers map[int]VCPUInfo // by vCPU id
	errs    []error
	want    int
	done    chan struct{}
}

// answer records v's state, read on v's own goroutine, unless v already
// answered this request.
func (r *peekRequest) answer(v *kvm.VCPU) {
	r.mu.Lock()
	_, seen := r.answers[v.ID()]
	r.mu.Unlock()
	if seen {
		return
	}
	info, err := readVCPUInfo(v)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.answers[v.ID()]; seen {
		return
	}
	r.answers[v.ID()] = info
	if err != nil {
		r.errs = append(r.errs, err)
	}
	if len(r.answers) == r.want {
		close(r.done)
	}
}

// readVCPUInfo reads what VCPUInfo holds from v; the caller is v's owner.
func readVCPUInfo(v *kvm.VCPU) (VCPUInfo, error) {
	info := VCPUInfo{ID: v.ID()}
	r, err := v.Regs()
	if err != nil {
		return info, fmt.Errorf("vCPU %d: %w", v.ID(), err)
	}
	s, err := v.Sregs()
	if err != nil {
		return info, fmt.Errorf("vCPU %d: %w", v.ID(), err)
	}
	mp, err := v.MPState()
	if err != nil {
		return info, fmt.Errorf("vCPU %d: %w", v.ID(), err)
	}
	info.RIP, info.RSP, info.RFLAGS, info.CR3, info.MPState = r.RIP, r.RSP, r.RFLAGS, s.CR3, mp
	return info, nil
}

// peekState is the machine's part of peeking (the comment above).
type peekState struct {
	peekMu  sync.Mutex
	peekReq atomic.Pointer[peekRequest]
}

// servePeek answers the current peek request, if any, on v's goroutine.
func (m *Machine) servePeek(v *kvm.VCPU) {
	if r := m.peek.peekReq.Load(); r != nil {
		r.answer(v)
	}
}

// PeekVCPUs returns where each vCPU stands, in vCPU order, without
// stopping the guest for longer than it takes to read the registers. It
// fails when the machine is not running, is paused (its vCPUs are parked,
// not between exits), or ctx ends before every vCPU answered (a vCPU stuck
// in a device's exit handler: the answers it has are returned with the
// error).
func (m *Machine) PeekVCPUs(ctx context.Context) ([]VCPUInfo, error) {
	if !m.running.Load() || m.Stopped() {
		return nil, ErrNotRunning
	}
	if m.Paused() {
		return nil, fmt.Errorf("vmm: peek: the machine is paused")
	}
	m.peek.peekMu.Lock()
	defer m.peek.peekMu.Unlock()
	r := &peekRequest{answers: map[int]VCPUInfo{}, want: len(m.vcpus), done: make(chan struct{})}
	m.peek.peekReq.Store(r)
	defer m.peek.peekReq.Store(nil)
	for _, v := range m.vcpus {
		v.Kick()
	}
	var waitErr error
	select {
	case <-r.done:
	case <-ctx.Done():
		waitErr = fmt.Errorf("vmm: peek: waiting for the vCPUs: %w", ctx.Err())
	case <-m.stopped:
		waitErr = ErrNotRunning
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]VCPUInfo, 0, len(r.answers))
	for _, v := range m.vcpus {
		if info, ok := r.answers[v.ID()]; ok {
			out = append(out, info)
		}
	}
	if waitErr == nil && len(r.errs) > 0 {
		waitErr = fmt.Errorf("vmm: peek: %w", r.errs[0])
	}
	return out, waitErr
}
