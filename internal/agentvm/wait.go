package agentvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/vsock"
)

// Port is the agent's vsock port.
const Port = agentapi.DefaultPort

// Wait connects to m's agent once it answers (before it listens the VMM
// refuses the CONNECT), giving up when the VM ends (vmDone closes) or
// timeout passes. A failure names the vsock device's counters (whether
// the guest's driver ever took a request, refused, or never answered),
// each virtio device's status and where each vCPU stands (guestState): a
// guest that hung while booting shows how far it got.
func Wait(ctx context.Context, m *microvm.Machine, timeout time.Duration, vmDone <-chan struct{}) (*agentapi.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout,
		fmt.Errorf("the guest agent did not answer on vsock port %d within %v", Port, timeout))
	defer cancel()
	go func() {
		select {
		case <-vmDone:
			cancel()
		case <-ctx.Done():
		}
	}()
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) { return m.DialVsock(ctx, Port) })
	if errors.Is(err, microvm.ErrStopped) {
		// The machine is stopping: Run returns in a moment, and the
		// caller reports how it ended.
		select {
		case <-vmDone:
		case <-time.After(10 * time.Second):
		}
	}
	select {
	case <-vmDone:
		if err != nil {
			return nil, errors.New("the VM ended before its agent answered")
		}
	default:
	}
	if err != nil {
		return nil, fmt.Errorf("%w [%s] [%s]", err, vsockBrief(m.VsockStats()), guestState(m))
	}
	return cc, nil
}

// peekTimeout bounds how long guestState waits for the vCPUs to answer.
const peekTimeout = 2 * time.Second

// guestState is one line: each virtio device's status byte and each
// vCPU's instruction pointer, flags and run state (halted or runnable).
// An instruction pointer in the guest kernel names, with its System.map,
// the function a hung boot is in.
func guestState(m *microvm.Machine) string {
	ctx, cancel := context.WithTimeout(context.Background(), peekTimeout)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "virtio devices: %s; ", m.DeviceStatuses())
	vcpus, err := m.PeekVCPUs(ctx)
	for i, v := range vcpus {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(v.String())
	}
	if err != nil {
		if len(vcpus) > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "vCPUs: %v", err)
	}
	return b.String()
}

// vsockBrief is the part of the vsock device's counters that tells a
// connection that was never answered from one the guest refused.
func vsockBrief(st vsock.Stats) string {
	return fmt.Sprintf("vsock device: %d connections opened, %d refused, %d open; %d packets from the guest, %d to it; "+
		"%d TX kicks, %d RX kicks, %d RX interrupts, %d passes without RX buffers, %d guest errors",
		st.ConnsOpened, st.ConnsRefused, st.ConnsOpen, st.TxPackets, st.RxPackets,
		st.TxKicks, st.RxKicks, st.Interrupts, st.RxQueueFull, st.GuestErrors)
}
